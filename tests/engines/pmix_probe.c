/* What a launcher's PMIx server provides: the keys lib/bootstrap/bootstrap_pmix.c
 * reads (and a few it might), then a put/commit/fence/get round trip.
 * One line per rank:  rank R/N key=value ... exchange=ok
 * Exit 0 when every key lib needs is there and the exchange works, 1 when a
 * key lib needs is missing, 3 when PMIx_Init fails. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int get_u32(const pmix_proc_t *p, const char *key, unsigned *out)
{
	pmix_value_t *v = NULL;
	pmix_info_t info;
	PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, NULL, PMIX_BOOL);
	pmix_status_t rc = PMIx_Get(p, key, &info, 1, &v);
	PMIX_INFO_DESTRUCT(&info);
	if (rc != PMIX_SUCCESS || !v)
		return -1;
	int ok = 0;
	switch (v->type) {
	case PMIX_UINT32: *out = v->data.uint32; break;
	case PMIX_UINT16: *out = v->data.uint16; break;
	case PMIX_INT: *out = (unsigned)v->data.integer; break;
	default:
		if (v->type == PMIX_PROC_RANK)
			*out = v->data.rank;
		else
			ok = -1;
	}
	PMIX_VALUE_RELEASE(v);
	return ok;
}

static int get_str(const pmix_proc_t *p, const char *key, char *buf, size_t n)
{
	pmix_value_t *v = NULL;
	if (PMIx_Get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v)
		return -1;
	int ok = v->type == PMIX_STRING ? 0 : -1;
	if (!ok)
		snprintf(buf, n, "%s", v->data.string);
	PMIX_VALUE_RELEASE(v);
	return ok;
}

int main(void)
{
	pmix_proc_t me, wild;
	if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
		fprintf(stderr, "pmix_probe: PMIx_Init failed\n");
		return 3;
	}
	PMIX_PROC_LOAD(&wild, me.nspace, PMIX_RANK_WILDCARD);
	/* key, proc (0 me, 1 wildcard), needed by lib */
	static const struct { const char *name, *key; int wild, needed; } keys[] = {
		{"JOB_SIZE", PMIX_JOB_SIZE, 1, 1},
		{"LOCAL_SIZE", PMIX_LOCAL_SIZE, 1, 1},
		{"LOCAL_RANK", PMIX_LOCAL_RANK, 0, 1},
		{"NODEID", PMIX_NODEID, 0, 1},
		{"NUM_NODES", PMIX_NUM_NODES, 1, 1},
		{"NODE_RANK", PMIX_NODE_RANK, 0, 0},
		{"UNIV_SIZE", PMIX_UNIV_SIZE, 1, 0},
		{"APPNUM", PMIX_APPNUM, 0, 0},
	};
	char line[2048];
	int off = snprintf(line, sizeof line, "rank %u nspace=%s", me.rank, me.nspace);
	int missing = 0;
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		unsigned u;
		if (get_u32(keys[i].wild ? &wild : &me, keys[i].key, &u) == 0)
			off += snprintf(line + off, sizeof line - off, " %s=%u", keys[i].name, u);
		else {
			off += snprintf(line + off, sizeof line - off, " %s=MISSING%s", keys[i].name,
					keys[i].needed ? "(needed)" : "");
			missing += keys[i].needed;
		}
	}
	char s[1024];
	if (get_str(&me, PMIX_HOSTNAME, s, sizeof s) == 0)
		off += snprintf(line + off, sizeof line - off, " HOSTNAME=%s", s);
	if (get_str(&wild, PMIX_LOCAL_PEERS, s, sizeof s) == 0)
		off += snprintf(line + off, sizeof line - off, " LOCAL_PEERS=%s", s);

	/* put / commit / fence(collect) / get from the next rank */
	unsigned size = 0;
	get_u32(&wild, PMIX_JOB_SIZE, &size);
	char val[64];
	snprintf(val, sizeof val, "probe-from-%u", me.rank);
	pmix_value_t pv;
	PMIX_VALUE_LOAD(&pv, val, PMIX_STRING);
	int xok = PMIx_Put(PMIX_GLOBAL, "dptp.probe", &pv) == PMIX_SUCCESS && PMIx_Commit() == PMIX_SUCCESS;
	PMIX_VALUE_DESTRUCT(&pv);
	pmix_info_t coll;
	bool t = true;
	PMIX_INFO_LOAD(&coll, PMIX_COLLECT_DATA, &t, PMIX_BOOL);
	xok = xok && PMIx_Fence(&wild, 1, &coll, 1) == PMIX_SUCCESS;
	PMIX_INFO_DESTRUCT(&coll);
	if (xok && size) {
		pmix_proc_t peer;
		PMIX_PROC_LOAD(&peer, me.nspace, (me.rank + 1) % size);
		char want[64];
		snprintf(want, sizeof want, "probe-from-%u", peer.rank);
		xok = get_str(&peer, "dptp.probe", s, sizeof s) == 0 && strcmp(s, want) == 0;
	}
	snprintf(line + off, sizeof line - off, " exchange=%s", xok ? "ok" : "FAILED");
	printf("%s\n", line);
	fflush(stdout);
	PMIx_Finalize(NULL, 0);
	return missing ? 1 : xok ? 0 : 1;
}
