/* A PMIx client for test_pmix_srv: prints its rank, the job's size and
 * the local size on stdout, then, by argv[1]:
 *   fence       PMIx_Fence over the whole job, PMIx_Finalize
 *   fence-wait  the same once a byte came on stdin
 *   nofinalize  nothing more: exits 0 after PMIx_Init alone
 *   abort       PMIx_Abort(7, "unit abort")
 *   notify      PMIx_Notify_event(-3123, range session), PMIx_Finalize */
#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int notified;
static void notify_done(pmix_status_t status, void *cbdata)
{
	(void)status;
	(void)cbdata;
	notified = 1;
}

static unsigned get_u32(const pmix_proc_t *p, const char *key)
{
	pmix_value_t *v = NULL;
	unsigned out = 0;
	if (PMIx_Get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v)
		return 0;
	if (v->type == PMIX_UINT32)
		out = v->data.uint32;
	PMIX_VALUE_RELEASE(v);
	return out;
}

int main(int argc, char **argv)
{
	pmix_proc_t me, wild;
	const char *mode = argc > 1 ? argv[1] : "fence";
	if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS)
		return 2;
	PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
	printf("rank %u size %u local %u\n", me.rank, get_u32(&wild, PMIX_JOB_SIZE), get_u32(&wild, PMIX_LOCAL_SIZE));
	fflush(stdout);
	if (!strcmp(mode, "nofinalize"))
		return 0;
	if (!strcmp(mode, "abort")) {
		PMIx_Abort(7, "unit abort", NULL, 0);
		return 3;
	}
	if (!strcmp(mode, "notify")) {
		if (PMIx_Notify_event(-3123, &me, PMIX_RANGE_SESSION, NULL, 0, notify_done, NULL) != PMIX_SUCCESS)
			return 6;
		for (int i = 0; i < 2000 && !notified; i++)
			usleep(5000);
		PMIx_Finalize(NULL, 0);
		return notified ? 0 : 7;
	}
	if (!strcmp(mode, "fence-wait")) {
		char c;
		if (read(0, &c, 1) != 1)
			return 4;
	}
	pmix_info_t collect;
	bool yes = true;
	PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
	int rc = PMIx_Fence(&wild, 1, &collect, 1);
	PMIX_INFO_DESTRUCT(&collect);
	PMIx_Finalize(NULL, 0);
	return rc == PMIX_SUCCESS ? 0 : 5;
}
