/* PMIx clients run under dptp-run by pmix_e2e.py, one per mode (argv[1]),
 * covering what OpenPMIx's v4.2 example programs exercise:
 *   hello     PMIx_Init, own name and job size agree with RANK/WORLD_SIZE
 *   client    PMIx_Put of local, remote and global keys of several types,
 *             Commit, a collecting Fence, then every peer's keys by Get
 *   dmodex    Put and Commit without a collecting fence: Gets go through
 *             the direct modex; a key no one put is NOT_FOUND, in bounded time
 *   nodeinfo  node-level keys: hostname, node id, number of nodes, local
 *             peers, local and node size, each peer's node id
 *   jctrl     PMIx_Job_control registers a file and a directory (argv[2])
 *             for cleanup: SUCCESS; a kill directive: NOT_SUPPORTED
 *   log       PMIx_Log to stderr (the launcher prints it)
 *   query     PMIx_Query_info: namespaces, job size, process table, spawn
 *             support (none)
 *   event     rank 0 notifies a job-wide event (PMIX_RANGE_NAMESPACE) with a
 *             payload; every other rank, on any node, receives it within 10 s
 *   dynamic   publish, lookup, group construction and a fence over
 *             an unknown namespace all fail at once, on every rank; the
 *             job then fences and finalizes normally
 * Prints "<mode> ok rank R" on success; on a failed check an error on
 * stderr and exit 1 (after PMIx_Finalize). */
#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pmix_proc_t me, wild;
static uint32_t size;

#define FAIL(...) do { fprintf(stderr, "rank %u: ", me.rank); fprintf(stderr, __VA_ARGS__); \
	fputc('\n', stderr); PMIx_Finalize(NULL, 0); exit(1); } while (0)

static int get_timeout = 5; /* seconds */

static pmix_value_t *get(const pmix_proc_t *p, const char *key, pmix_status_t *rc)
{
	pmix_value_t *v = NULL;
	pmix_info_t info[1];
	int timeout = get_timeout;
	PMIX_INFO_LOAD(&info[0], PMIX_TIMEOUT, &timeout, PMIX_INT);
	*rc = PMIx_Get(p, key, info, 1, &v);
	PMIX_INFO_DESTRUCT(&info[0]);
	return *rc == PMIX_SUCCESS ? v : NULL;
}

static uint32_t get_u32(const pmix_proc_t *p, const char *key)
{
	pmix_status_t rc;
	pmix_value_t *v = get(p, key, &rc);
	uint32_t out = 0;
	if (!v)
		FAIL("get %s of rank %u: %s", key, p->rank, PMIx_Error_string(rc));
	if (v->type == PMIX_UINT32)
		out = v->data.uint32;
	else if (v->type == PMIX_UINT16)
		out = v->data.uint16;
	else if (v->type == PMIX_PROC_RANK)
		out = v->data.rank;
	else
		FAIL("%s has type %d", key, (int)v->type);
	PMIX_VALUE_RELEASE(v);
	return out;
}

static void get_str(const pmix_proc_t *p, const char *key, char *buf, size_t len)
{
	pmix_status_t rc;
	pmix_value_t *v = get(p, key, &rc);
	if (!v || v->type != PMIX_STRING)
		FAIL("get %s of rank %u: %s", key, p->rank, v ? "not a string" : PMIx_Error_string(rc));
	snprintf(buf, len, "%s", v->data.string);
	PMIX_VALUE_RELEASE(v);
}

static void put(pmix_scope_t scope, const char *key, const void *val, pmix_data_type_t type)
{
	pmix_value_t v;
	PMIX_VALUE_LOAD(&v, val, type);
	if (PMIx_Put(scope, key, &v) != PMIX_SUCCESS)
		FAIL("put %s", key);
	PMIX_VALUE_DESTRUCT(&v);
}

static void fence_all(bool collect)
{
	pmix_info_t info;
	pmix_status_t rc;
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
	rc = PMIx_Fence(&wild, 1, &info, 1);
	PMIX_INFO_DESTRUCT(&info);
	if (rc != PMIX_SUCCESS)
		FAIL("fence (collect %d): %s", collect, PMIx_Error_string(rc));
}

static void mode_hello(const char *arg)
{
	(void)arg;
	const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
	if (!r || !w || (uint32_t)atoi(r) != me.rank || (uint32_t)atoi(w) != size)
		FAIL("RANK=%s WORLD_SIZE=%s but PMIx says %u of %u", r ? r : "-", w ? w : "-", me.rank, size);
	printf("hello from rank %u of %u in %s\n", me.rank, size, me.nspace);
}

/* local keys reach local peers only, remote keys the other nodes only,
 * global keys everyone */
static void mode_client(const char *arg)
{
	(void)arg;
	char str[64];
	uint64_t u = 1000u + me.rank;
	float f = 0.5f * (float)me.rank;
	pmix_byte_object_t bo = {.bytes = (char *)&u, .size = sizeof(u)};
	snprintf(str, sizeof(str), "remote-of-%u", me.rank);
	put(PMIX_LOCAL, "dptp.local", &u, PMIX_UINT64);
	put(PMIX_REMOTE, "dptp.remote", str, PMIX_STRING);
	put(PMIX_GLOBAL, "dptp.float", &f, PMIX_FLOAT);
	put(PMIX_GLOBAL, "dptp.bytes", &bo, PMIX_BYTE_OBJECT);
	if (PMIx_Commit() != PMIX_SUCCESS)
		FAIL("commit");
	fence_all(true);
	for (uint32_t r = 0; r < size; r++) {
		pmix_proc_t p;
		pmix_status_t rc;
		pmix_value_t *v;
		PMIX_LOAD_PROCID(&p, me.nspace, r);
		if (!(v = get(&p, "dptp.float", &rc)) || v->type != PMIX_FLOAT || v->data.fval != 0.5f * (float)r)
			FAIL("float of rank %u", r);
		PMIX_VALUE_RELEASE(v);
		if (!(v = get(&p, "dptp.bytes", &rc)) || v->type != PMIX_BYTE_OBJECT || v->data.bo.size != 8 ||
		    memcmp(v->data.bo.bytes, &(uint64_t){1000u + r}, 8))
			FAIL("byte object of rank %u", r);
		PMIX_VALUE_RELEASE(v);
		if (r != me.rank) { /* all on this node: local keys visible */
			if (!(v = get(&p, "dptp.local", &rc)) || v->type != PMIX_UINT64 || v->data.uint64 != 1000u + r)
				FAIL("local key of rank %u: %s", r, PMIx_Error_string(rc));
			PMIX_VALUE_RELEASE(v);
		}
	}
	printf("client ok rank %u\n", me.rank);
}

static void mode_dmodex(const char *arg)
{
	(void)arg;
	char str[64], buf[64];
	pmix_status_t rc;
	pmix_value_t *v;
	snprintf(str, sizeof(str), "dmodex-of-%u", me.rank);
	put(PMIX_GLOBAL, "dptp.dm", str, PMIX_STRING);
	if (PMIx_Commit() != PMIX_SUCCESS)
		FAIL("commit");
	fence_all(false); /* everyone committed; nothing collected */
	for (uint32_t r = 0; r < size; r++) {
		pmix_proc_t p;
		PMIX_LOAD_PROCID(&p, me.nspace, r);
		get_str(&p, "dptp.dm", buf, sizeof(buf));
		snprintf(str, sizeof(str), "dmodex-of-%u", r);
		if (strcmp(buf, str))
			FAIL("dmodex of rank %u: '%s'", r, buf);
		get_timeout = 1; /* a local peer's server waits for the key until then */
		if ((v = get(&p, "dptp.never-put", &rc)) || rc == PMIX_SUCCESS)
			FAIL("a key never put was found on rank %u", r);
		get_timeout = 5;
	}
	fence_all(false); /* no one leaves while another still asks */
	printf("dmodex ok rank %u\n", me.rank);
}

static void mode_nodeinfo(const char *arg)
{
	(void)arg;
	char host[256], mine[256], peers[1024];
	uint32_t nodeid, nnodes, lsize, nsize;
	pmix_proc_t p;
	gethostname(mine, sizeof(mine) - 1);
	get_str(&me, PMIX_HOSTNAME, host, sizeof(host));
	if (strcmp(host, mine))
		FAIL("hostname '%s', gethostname '%s'", host, mine);
	nodeid = get_u32(&me, PMIX_NODEID);
	nnodes = get_u32(&wild, PMIX_NUM_NODES);
	lsize = get_u32(&wild, PMIX_LOCAL_SIZE);
	nsize = get_u32(&wild, PMIX_NODE_SIZE);
	get_str(&wild, PMIX_LOCAL_PEERS, peers, sizeof(peers));
	if (nodeid != 0 || nnodes != 1 || lsize != size || nsize != size)
		FAIL("node %u of %u, local size %u, node size %u (job %u)", nodeid, nnodes, lsize, nsize, size);
	for (uint32_t r = 0; r < size; r++) {
		char want[16];
		PMIX_LOAD_PROCID(&p, me.nspace, r);
		if (get_u32(&p, PMIX_NODEID) != 0 || get_u32(&p, PMIX_LOCAL_RANK) != r)
			FAIL("rank %u: node id or local rank", r);
		snprintf(want, sizeof(want), "%u", r);
		if (!strstr(peers, want))
			FAIL("local peers '%s' lack %u", peers, r);
	}
	printf("nodeinfo ok rank %u: node %u of %u, %u local\n", me.rank, nodeid, nnodes, lsize);
}

static void mode_jctrl(const char *dir)
{
	if (!dir)
		FAIL("jctrl needs a directory");
	char file[512], sub[512], path[600];
	pmix_info_t info[2];
	bool yes = true;
	pmix_status_t rc;
	FILE *f;
	snprintf(file, sizeof(file), "%s/file-%u", dir, me.rank);
	snprintf(sub, sizeof(sub), "%s/dir-%u", dir, me.rank);
	snprintf(path, sizeof(path), "%s/inner", sub);
	if (!(f = fopen(file, "w")) || fclose(f) || mkdir(sub, 0700) || mkdir(path, 0700) ||
	    !(f = fopen(strcat(path, "/x"), "w")) || fclose(f))
		FAIL("cannot create files in %s", dir);
	PMIX_INFO_LOAD(&info[0], PMIX_REGISTER_CLEANUP, file, PMIX_STRING);
	if ((rc = PMIx_Job_control(NULL, 0, info, 1, NULL, NULL)) != PMIX_SUCCESS)
		FAIL("register cleanup of %s: %s", file, PMIx_Error_string(rc));
	PMIX_INFO_DESTRUCT(&info[0]);
	PMIX_INFO_LOAD(&info[0], PMIX_REGISTER_CLEANUP_DIR, sub, PMIX_STRING);
	PMIX_INFO_LOAD(&info[1], PMIX_CLEANUP_RECURSIVE, &yes, PMIX_BOOL);
	if ((rc = PMIx_Job_control(NULL, 0, info, 2, NULL, NULL)) != PMIX_SUCCESS)
		FAIL("register cleanup of %s: %s", sub, PMIx_Error_string(rc));
	PMIX_INFO_DESTRUCT(&info[0]);
	PMIX_INFO_LOAD(&info[0], PMIX_JOB_CTRL_KILL, &yes, PMIX_BOOL);
	if ((rc = PMIx_Job_control(&me, 1, info, 1, NULL, NULL)) != PMIX_ERR_NOT_SUPPORTED)
		FAIL("kill directive answered %s, want NOT-SUPPORTED", PMIx_Error_string(rc));
	fence_all(false);
	printf("jctrl ok rank %u\n", me.rank);
}

static void mode_log(const char *arg)
{
	(void)arg;
	char msg[128];
	pmix_info_t info;
	pmix_status_t rc;
	snprintf(msg, sizeof(msg), "log line from rank %u\nsecond line from rank %u", me.rank, me.rank);
	PMIX_INFO_LOAD(&info, PMIX_LOG_STDERR, msg, PMIX_STRING);
	if ((rc = PMIx_Log(&info, 1, NULL, 0)) != PMIX_SUCCESS)
		FAIL("PMIx_Log: %s", PMIx_Error_string(rc));
	PMIX_INFO_DESTRUCT(&info);
	printf("log ok rank %u\n", me.rank);
}

static const pmix_info_t *find(const pmix_info_t *res, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (!strncmp(res[i].key, key, PMIX_MAX_KEYLEN))
			return &res[i];
	return NULL;
}

static void mode_query(const char *arg)
{
	(void)arg;
	pmix_query_t *q;
	pmix_info_t *res = NULL;
	size_t nres = 0;
	pmix_status_t rc;
	const pmix_info_t *i;
	const char *keys[] = {PMIX_QUERY_NAMESPACES, PMIX_QUERY_PROC_TABLE, PMIX_QUERY_SPAWN_SUPPORT, PMIX_QUERY_JOB_STATUS};
	const char *host = getenv("DPTP_HOSTNAME");
	PMIX_QUERY_CREATE(q, 1);
	q[0].keys = calloc(5, sizeof(char *));
	for (size_t k = 0; q[0].keys && k < 4; k++)
		q[0].keys[k] = strdup(keys[k]);
	/* every rank runs once all passed a fence; the other nodes' pids reach
	 * this node's launcher moments after theirs started (up to 5 s here) */
	fence_all(false);
	for (int tries = 0;; tries++) {
		rc = PMIx_Query_info(q, 1, &res, &nres);
		if (rc != PMIX_SUCCESS)
			FAIL("query: %s", PMIx_Error_string(rc));
		i = find(res, nres, PMIX_QUERY_PROC_TABLE);
		bool all = i && i->value.type == PMIX_DATA_ARRAY && i->value.data.darray->type == PMIX_PROC_INFO;
		for (size_t r = 0; all && r < i->value.data.darray->size; r++)
			all = ((pmix_proc_info_t *)i->value.data.darray->array)[r].pid > 0;
		if (all || tries == 50)
			break;
		PMIX_INFO_FREE(res, nres);
		usleep(100000);
	}
	if (!(i = find(res, nres, PMIX_QUERY_NAMESPACES)) || i->value.type != PMIX_STRING ||
	    strcmp(i->value.data.string, me.nspace))
		FAIL("namespaces: want '%s'", me.nspace);
	if (!(i = find(res, nres, PMIX_QUERY_SPAWN_SUPPORT)) || i->value.type != PMIX_STRING || *i->value.data.string)
		FAIL("spawn support should be an empty list");
	if (!(i = find(res, nres, PMIX_QUERY_JOB_STATUS)))
		FAIL("no job status");
	if (!(i = find(res, nres, PMIX_QUERY_PROC_TABLE)) || i->value.type != PMIX_DATA_ARRAY ||
	    i->value.data.darray->type != PMIX_PROC_INFO || i->value.data.darray->size != size)
		FAIL("process table: want %u entries", size);
	pmix_proc_info_t *pi = i->value.data.darray->array;
	for (uint32_t r = 0; r < size; r++)
		if (pi[r].proc.rank != r || pi[r].pid <= 0 || (r == me.rank && pi[r].pid != getpid()) ||
		    pi[r].state != PMIX_PROC_STATE_RUNNING)
			FAIL("process table entry %u: rank %u pid %d state %d", r, pi[r].proc.rank, (int)pi[r].pid,
				(int)pi[r].state);
	/* the node's name as the job knows it, and every rank's host listed */
	if (host && *host && (!pi[me.rank].hostname || strcmp(pi[me.rank].hostname, host)))
		FAIL("process table: own host '%s', want DPTP_HOSTNAME '%s'", pi[me.rank].hostname, host);
	printf("query hosts rank %u:", me.rank);
	for (uint32_t r = 0; r < size; r++)
		printf(" %s", pi[r].hostname ? pi[r].hostname : "?");
	printf("\n");
	PMIX_INFO_FREE(res, nres);
	PMIX_QUERY_FREE(q, 1);
	fence_all(false); /* every rank alive while the others ask */
	printf("query ok rank %u\n", me.rank);
}

#define DPTP_EVENT (PMIX_EXTERNAL_ERR_BASE - 101)
static volatile int ev_got = -1;
static char ev_payload[64];

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
	pmix_info_t results[], size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
	(void)id;
	(void)results;
	(void)nresults;
	for (size_t i = 0; i < ninfo; i++)
		if (!strncmp(info[i].key, "dptp.ev", PMIX_MAX_KEYLEN) && info[i].value.type == PMIX_STRING)
			snprintf(ev_payload, sizeof(ev_payload), "%s", info[i].value.data.string);
	if (status == DPTP_EVENT && source)
		ev_got = (int)source->rank;
	if (cbfunc)
		cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static void mode_event(const char *arg)
{
	pmix_status_t code = DPTP_EVENT, rc;
	pmix_info_t info;
	(void)arg;
	rc = PMIx_Register_event_handler(&code, 1, NULL, 0, on_event, NULL, NULL);
	if (rc < 0)
		FAIL("register event handler: %s", PMIx_Error_string(rc));
	fence_all(false); /* every handler is in place */
	if (me.rank == 0) {
		PMIX_INFO_LOAD(&info, "dptp.ev", "payload-from-0", PMIX_STRING);
		rc = PMIx_Notify_event(DPTP_EVENT, &me, PMIX_RANGE_NAMESPACE, &info, 1, NULL, NULL);
		PMIX_INFO_DESTRUCT(&info);
		if (rc != PMIX_SUCCESS && rc != PMIX_OPERATION_SUCCEEDED)
			FAIL("notify: %s", PMIx_Error_string(rc));
	} else {
		for (int i = 0; i < 1000 && ev_got < 0; i++)
			usleep(10000);
		if (ev_got != 0 || strcmp(ev_payload, "payload-from-0"))
			FAIL("no event from rank 0 within 10 s (source %d, payload '%s')", ev_got, ev_payload);
	}
	fence_all(false);
	printf("event ok rank %u\n", me.rank);
}

static void expect_fail(const char *what, pmix_status_t rc)
{
	if (rc == PMIX_SUCCESS || rc == PMIX_OPERATION_SUCCEEDED)
		FAIL("%s succeeded; it must fail", what);
	printf("dynamic rank %u: %s refused (%s)\n", me.rank, what, PMIx_Error_string(rc));
}

static void mode_dynamic(const char *arg)
{
	(void)arg;
	pmix_info_t info;
	pmix_pdata_t pd;
	pmix_info_t *res = NULL;
	size_t nres = 0;
	pmix_proc_t two[2];
	PMIX_INFO_LOAD(&info, "dptp.pub", "v", PMIX_STRING);
	expect_fail("publish", PMIx_Publish(&info, 1));
	PMIX_INFO_DESTRUCT(&info);
	PMIX_PDATA_CONSTRUCT(&pd);
	PMIX_LOAD_KEY(pd.key, "dptp.pub");
	expect_fail("lookup", PMIx_Lookup(&pd, 1, NULL, 0));
	PMIX_PDATA_DESTRUCT(&pd);
	expect_fail("group construct", PMIx_Group_construct("dptp-grp", &wild, 1, NULL, 0, &res, &nres));
	PMIX_LOAD_PROCID(&two[0], me.nspace, me.rank);
	PMIX_LOAD_PROCID(&two[1], "dptp-no-such-job", PMIX_RANK_WILDCARD);
	expect_fail("fence over an unknown namespace", PMIx_Fence(two, 2, NULL, 0));
	fence_all(false);
	printf("dynamic ok rank %u\n", me.rank);
}

static const struct {
	const char *name;
	void (*run)(const char *arg);
} modes[] = {
	{"hello", mode_hello}, {"client", mode_client}, {"dmodex", mode_dmodex}, {"nodeinfo", mode_nodeinfo},
	{"jctrl", mode_jctrl}, {"log", mode_log}, {"query", mode_query}, {"dynamic", mode_dynamic},
	{"event", mode_event},
};

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "hello";
	pmix_status_t rc;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((rc = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS) {
		fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
		return 1;
	}
	PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
	size = get_u32(&wild, PMIX_JOB_SIZE);
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (!strcmp(mode, modes[i].name)) {
			modes[i].run(argc > 2 ? argv[2] : NULL);
			PMIx_Finalize(NULL, 0);
			return 0;
		}
	FAIL("unknown mode '%s'", mode);
}
