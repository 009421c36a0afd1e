/* PMIx client run under dptp-run by the launcher tests: checks the job
 * description, Put/Commit/Fence(collect)/Get across all ranks, a fence over
 * a subset of the ranks, and (with "abort") that PMIx_Abort ends the job. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;

#define FAIL(...) do { fprintf(stderr, "rank %u: ", me.rank); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); PMIx_Finalize(NULL, 0); return 1; } while (0)

static int get_u32(const pmix_proc_t *p, const char *key, uint32_t *out)
{
	pmix_value_t *v = NULL;
	if (PMIx_Get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v)
		return -1;
	if (v->type == PMIX_UINT32)
		*out = v->data.uint32;
	else if (v->type == PMIX_UINT16)
		*out = v->data.uint16;
	else if (v->type == PMIX_PROC_RANK)
		*out = v->data.rank;
	else {
		PMIX_VALUE_RELEASE(v);
		return -1;
	}
	PMIX_VALUE_RELEASE(v);
	return 0;
}

static int get_str(const pmix_proc_t *p, const char *key, char *buf, size_t len)
{
	pmix_value_t *v = NULL;
	if (PMIx_Get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v || v->type != PMIX_STRING) {
		if (v)
			PMIX_VALUE_RELEASE(v);
		return -1;
	}
	snprintf(buf, len, "%s", v->data.string);
	PMIX_VALUE_RELEASE(v);
	return 0;
}

static int fence(const pmix_proc_t *procs, size_t n, bool collect)
{
	pmix_info_t info;
	int rc;
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
	rc = PMIx_Fence(procs, n, &info, 1);
	PMIX_INFO_DESTRUCT(&info);
	return rc;
}

int main(int argc, char **argv)
{
	pmix_proc_t wild, peer;
	uint32_t size = 0, lsize = 0, usize = 0, lrank = 0, nrank = 0;
	char buf[256], key[64], val[64];
	pmix_value_t v;
	const char *env;

	if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
		fprintf(stderr, "PMIx_Init failed\n");
		return 1;
	}
	PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
	if (get_u32(&wild, PMIX_JOB_SIZE, &size) || get_u32(&wild, PMIX_LOCAL_SIZE, &lsize) ||
	    get_u32(&wild, PMIX_UNIV_SIZE, &usize))
		FAIL("job size/local size/universe size missing");
	if (get_u32(&me, PMIX_LOCAL_RANK, &lrank) || get_u32(&me, PMIX_NODE_RANK, &nrank))
		FAIL("local/node rank missing");
	if (get_str(&wild, PMIX_LOCAL_PEERS, buf, sizeof(buf)))
		FAIL("local peers missing");
	env = getenv("RANK");
	if (!env || (unsigned)atoi(env) != me.rank)
		FAIL("RANK=%s but PMIx rank %u", env ? env : "(unset)", me.rank);
	env = getenv("WORLD_SIZE");
	if (!env || (unsigned)atoi(env) != size)
		FAIL("sizes disagree: WORLD_SIZE=%s job %u", env ? env : "(unset)", size);
	/* the universe: the job's cores as mpirun counts them, told alike */
	env = getenv("OMPI_UNIVERSE_SIZE");
	if (!env || (unsigned)atoi(env) != usize || usize < 1)
		FAIL("universe sizes disagree: OMPI_UNIVERSE_SIZE=%s PMIx %u", env ? env : "(unset)", usize);
	/* several nodes: the job spans them, local values are this node's */
	env = getenv("LOCAL_WORLD_SIZE");
	if (!env || (unsigned)atoi(env) != lsize)
		FAIL("LOCAL_WORLD_SIZE=%s but PMIx local size %u", env ? env : "(unset)", lsize);
	env = getenv("LOCAL_RANK");
	if (!env || (unsigned)atoi(env) != lrank || nrank != lrank)
		FAIL("LOCAL_RANK=%s but local rank %u node rank %u", env ? env : "(unset)", lrank, nrank);

	if (argc > 1 && !strcmp(argv[1], "abort")) {
		if (me.rank == 1)
			PMIx_Abort(7, "test abort", NULL, 0);
		sleep(60); /* the launcher must end this */
		return 0;
	}

	snprintf(val, sizeof(val), "value-of-%u", me.rank);
	PMIX_VALUE_LOAD(&v, val, PMIX_STRING);
	if (PMIx_Put(PMIX_GLOBAL, "dptp.test", &v) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
		FAIL("put/commit");
	PMIX_VALUE_DESTRUCT(&v);
	if (fence(NULL, 0, true) != PMIX_SUCCESS)
		FAIL("fence(all, collect)");
	for (uint32_t r = 0; r < size; r++) {
		PMIX_LOAD_PROCID(&peer, me.nspace, r);
		snprintf(key, sizeof(key), "value-of-%u", r);
		if (get_str(&peer, "dptp.test", buf, sizeof(buf)) || strcmp(buf, key))
			FAIL("get rank %u: got '%s'", r, buf);
	}

	/* a fence over a subset: the even ranks, then the odd ones, each
	 * sharing a second key among themselves only */
	if (size >= 2) {
		pmix_proc_t grp[64];
		size_t n = 0;
		for (uint32_t r = me.rank % 2; r < size && n < 64; r += 2, n++)
			PMIX_LOAD_PROCID(&grp[n], me.nspace, r); /* a macro: no n++ inside */
		snprintf(val, sizeof(val), "sub-%u", me.rank);
		PMIX_VALUE_LOAD(&v, val, PMIX_STRING);
		if (PMIx_Put(PMIX_GLOBAL, "dptp.sub", &v) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
			FAIL("put/commit (subset)");
		PMIX_VALUE_DESTRUCT(&v);
		if (fence(grp, n, true) != PMIX_SUCCESS)
			FAIL("fence(subset, collect)");
		for (size_t i = 0; i < n; i++) {
			snprintf(key, sizeof(key), "sub-%u", grp[i].rank);
			if (get_str(&grp[i], "dptp.sub", buf, sizeof(buf)) || strcmp(buf, key))
				FAIL("get subset rank %u: got '%s'", grp[i].rank, buf);
		}
		if (fence(NULL, 0, false) != PMIX_SUCCESS)
			FAIL("fence(all, no data)");
	}
	printf("pmix ok rank %u of %u\n", me.rank, size);
	fflush(stdout);
	PMIx_Finalize(NULL, 0);
	return 0;
}
