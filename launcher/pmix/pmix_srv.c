/* The launcher's PMIx server (see pmix_srv.h). */
#include "pmix/pmix_srv.h"
#include "pmix/crash_guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pmix.h>
#include <pmix_server.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum ev_type {
	EV_OPDONE, EV_FENCE, EV_CONNECTED, EV_FINALIZED, EV_ABORT, EV_DMODEX, EV_DMODEX_LOCAL,
	EV_NOTE, EV_QUERY, EV_NOTIFY /* data: the packed event */, EV_SPAWN,
	EV_CRASHED /* the library crashed (crash_guard.h): crash_ev */
};

/* One upcall, captured on the PMIx thread, completed on the main thread. */
struct srv_event {
	enum ev_type type;
	pmix_status_t status;
	pmix_proc_t proc;
	int abort_status;
	char *msg;
	char *data;
	size_t ndata;
	pmix_op_cbfunc_t opcb;
	pmix_modex_cbfunc_t modexcb;
	void *cbdata;
	pmix_proc_t *procs;
	size_t nprocs;
	void *token; /* EV_DMODEX_LOCAL */
	/* EV_NOTE: msg goes to stderr (data, when set, to stdout), then opcb */
	pmix_info_cbfunc_t infocb; /* EV_QUERY */
	pmix_query_t *queries; /* EV_QUERY */
	size_t nqueries;
	struct srv_event *next; /* in the stash */
};

struct pmix_srv_proc {
	enum pmix_srv_client state;
	bool started, exited;
	bool released; /* its client deregistered (pmix_srv_release_client) */
	pid_t pid;
	int exitcode;
};

/* A fence handed to the sink: the event itself. */
struct pmix_srv_fence {
	struct srv_event ev;
	const struct pmix_srv *srv;
};

static void release_data(void *cbdata);

/* The PMIx module has no context pointer: the write end of the event pipe is
 * the one piece of state the upcalls need. */
static int ev_write_fd = -1;
/* posted by crash_guard's handler: static, never freed */
static struct srv_event crash_ev = {.type = EV_CRASHED};

static void post(struct srv_event *ev)
{
	ssize_t n;
	do
		n = write(ev_write_fd, &ev, sizeof(ev));
	while (n < 0 && errno == EINTR);
	/* a pipe write of a pointer is atomic; a failure means the loop is gone */
}

static struct srv_event *ev_new(enum ev_type type)
{
	struct srv_event *ev = calloc(1, sizeof(*ev));
	if (ev)
		ev->type = type;
	return ev;
}

/* client_connected and client_finalized: the client waits for our answer */
static pmix_status_t post_client_op(enum ev_type type, const pmix_proc_t *proc, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	struct srv_event *ev = ev_new(type);
	if (!ev)
		return PMIX_ERR_NOMEM;
	ev->proc = *proc;
	ev->opcb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
	return PMIX_SUCCESS;
}

static pmix_status_t up_connected(const pmix_proc_t *proc, void *server_object, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	(void)server_object;
	return post_client_op(EV_CONNECTED, proc, cbfunc, cbdata);
}

static pmix_status_t up_finalized(const pmix_proc_t *proc, void *server_object, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	(void)server_object;
	return post_client_op(EV_FINALIZED, proc, cbfunc, cbdata);
}

static pmix_status_t up_abort(const pmix_proc_t *proc, void *server_object, int status,
	const char msg[], pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	struct srv_event *ev = ev_new(EV_ABORT);
	(void)server_object;
	(void)procs;
	(void)nprocs; /* any abort ends the whole job, as mpirun does */
	if (!ev)
		return PMIX_ERR_NOMEM;
	ev->proc = *proc;
	ev->abort_status = status;
	ev->msg = strdup(msg ? msg : "");
	ev->opcb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
	return PMIX_SUCCESS;
}

/* Called once every local participant of a fence (the whole job or any
 * subset of it) has contributed. On a single node the local data is all
 * the data, so the collected blob goes straight back. */
static pmix_status_t up_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
	size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
	struct pmix_srv_fence *f = calloc(1, sizeof(*f));
	struct srv_event *ev = &f->ev;
	(void)info;
	(void)ninfo;
	if (!f)
		return PMIX_ERR_NOMEM;
	ev->type = EV_FENCE;
	if (nprocs) {
		ev->procs = malloc(nprocs * sizeof(*procs));
		if (!ev->procs) {
			free(f);
			return PMIX_ERR_NOMEM;
		}
		memcpy(ev->procs, procs, nprocs * sizeof(*procs));
		ev->nprocs = nprocs;
	}
	if (ndata) {
		ev->data = malloc(ndata);
		if (!ev->data) {
			free(ev->procs);
			free(f);
			return PMIX_ERR_NOMEM;
		}
		memcpy(ev->data, data, ndata);
		ev->ndata = ndata;
	}
	ev->modexcb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
	return PMIX_SUCCESS;
}

struct pmix_srv_dmodex {
	struct srv_event ev;
};

static pmix_status_t up_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
	pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
	struct srv_event *ev = ev_new(EV_DMODEX);
	(void)info;
	(void)ninfo;
	if (!ev)
		return PMIX_ERR_NOMEM;
	ev->proc = *proc;
	ev->modexcb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
	return PMIX_SUCCESS;
}

unsigned pmix_srv_dmodex_rank(const struct pmix_srv_dmodex *d)
{
	return d->ev.proc.rank;
}

void pmix_srv_dmodex_complete(struct pmix_srv_dmodex *d, bool found, const void *data, size_t len)
{
	char *copy = NULL;
	if (found && len && (copy = malloc(len)))
		memcpy(copy, data, len);
	if (d->ev.modexcb && !crash_guard_tripped()) {
		if (found && (copy || !len))
			d->ev.modexcb(PMIX_SUCCESS, copy, copy ? len : 0, d->ev.cbdata, release_data, copy);
		else {
			d->ev.modexcb(PMIX_ERR_NOT_FOUND, NULL, 0, d->ev.cbdata, NULL, NULL);
			free(copy);
		}
	} else {
		free(copy);
	}
	free(d);
}

/* PMIx thread: the local server's answer for another node */
static void dmodex_local_cb(pmix_status_t status, char *data, size_t sz, void *cbdata)
{
	struct srv_event *ev = ev_new(EV_DMODEX_LOCAL);
	if (!ev)
		return;
	ev->status = status;
	ev->token = cbdata;
	if (status == PMIX_SUCCESS && sz && (ev->data = malloc(sz))) {
		memcpy(ev->data, data, sz);
		ev->ndata = sz;
	}
	post(ev);
}

int pmix_srv_dmodex_local(struct pmix_srv *s, unsigned rank, void *token)
{
	pmix_proc_t proc;
	if (!s->up || !s->nspace_registered)
		return -ENOTCONN;
	PMIX_LOAD_PROCID(&proc, s->nspace, rank);
	return PMIx_server_dmodex_request(&proc, dmodex_local_cb, token) == PMIX_SUCCESS ? 0 : -EIO;
}

static bool key_is(const pmix_info_t *i, const char *key)
{
	return !strncmp(i->key, key, PMIX_MAX_KEYLEN);
}

static const char *info_str(const pmix_info_t *i)
{
	return i->value.type == PMIX_STRING && i->value.data.string ? i->value.data.string : NULL;
}

/* dptp-run starts no processes on request: the caller gets NOT_SUPPORTED
 * at once, the user a line naming who asked for what, and the job ends
 * with that refusal as its root cause (the sink's refuse): the other ranks
 * of an MPI_Comm_spawn wait for the root inside Open MPI, a hang under
 * MPI_ERRORS_RETURN otherwise. */
static pmix_status_t up_spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
	const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cbfunc, void *cbdata)
{
	(void)job_info;
	(void)ninfo;
	(void)cbfunc;
	(void)cbdata;
	struct srv_event *ev = ev_new(EV_SPAWN);
	if (ev && asprintf(&ev->msg, "rank %u asked to spawn '%s' (PMIx_Spawn, MPI_Comm_spawn): "
		"dptp-run starts no processes on request; refused", proc->rank, napps && apps[0].cmd ? apps[0].cmd : "?") >= 0) {
		ev->proc = *proc;
		post(ev);
	} else {
		free(ev);
	}
	return PMIX_ERR_NOT_SUPPORTED;
}

/* PMIx_Job_control: OpenPMIx itself takes the cleanup directives
 * (PMIX_REGISTER_CLEANUP, _DIR and their modifiers) once the host has this
 * upcall, and runs them when a client finalizes, its connection drops or
 * it is deregistered (pmix_srv_abandon). What reaches us are the other
 * controls: kill, signal, pause, checkpoint, provisioning... not supported. */
static pmix_status_t up_job_control(const pmix_proc_t *requestor, const pmix_proc_t targets[], size_t ntargets,
	const pmix_info_t directives[], size_t ndirs, pmix_info_cbfunc_t cbfunc, void *cbdata)
{
	(void)requestor;
	(void)targets;
	(void)ntargets;
	(void)directives;
	(void)ndirs;
	(void)cbfunc;
	(void)cbdata;
	return PMIX_ERR_NOT_SUPPORTED;
}

static const char *log_keys[][2] = {
	{PMIX_LOG_STDERR, "stderr"}, {PMIX_LOG_STDOUT, "stdout"}, {PMIX_LOG_SYSLOG, "syslog"},
	{PMIX_LOG_LOCAL_SYSLOG, "syslog"}, {PMIX_LOG_GLOBAL_SYSLOG, "syslog"}, {PMIX_LOG_MSG, "log"},
};

/* PMIx_Log: every string entry becomes a line on the launcher's stderr
 * ("[rank N] stderr: ..."), stdout entries on its stdout. Others (email,
 * a job record) are not supported. */
static void up_log(const pmix_proc_t *client, const pmix_info_t data[], size_t ndata, const pmix_info_t directives[],
	size_t ndirs, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	struct srv_event *ev = ev_new(EV_NOTE);
	size_t err_len = 1, out_len = 1, eo = 0, oo = 0;
	bool unsupported = false;
	(void)directives;
	(void)ndirs;
	if (!ev) {
		if (cbfunc)
			cbfunc(PMIX_ERR_NOMEM, cbdata);
		return;
	}
	for (size_t i = 0; i < ndata; i++) {
		const char *text = info_str(&data[i]);
		size_t k = 0;
		while (k < sizeof(log_keys) / sizeof(log_keys[0]) && !key_is(&data[i], log_keys[k][0]))
			k++;
		size_t lines = 1;
		for (const char *c = text; c && *c; c++)
			lines += *c == '\n';
		if (k == sizeof(log_keys) / sizeof(log_keys[0]) || !text)
			unsupported = true;
		else if (!strcmp(log_keys[k][1], "stdout"))
			out_len += strlen(text) + 32 * lines;
		else
			err_len += strlen(text) + 48 * lines;
	}
	ev->msg = calloc(1, err_len);
	ev->data = calloc(1, out_len);
	for (size_t i = 0; ev->msg && ev->data && i < ndata; i++) {
		const char *text = info_str(&data[i]);
		for (size_t k = 0; text && k < sizeof(log_keys) / sizeof(log_keys[0]); k++) {
			if (!key_is(&data[i], log_keys[k][0]))
				continue;
			/* every line of a multi-line entry gets the prefix */
			for (const char *l = text; *l;) {
				size_t n = strcspn(l, "\n");
				if (!strcmp(log_keys[k][1], "stdout"))
					oo += (size_t)snprintf(ev->data + oo, out_len - oo, "[rank %u] %.*s\n", client->rank,
						(int)n, l);
				else
					eo += (size_t)snprintf(ev->msg + eo, err_len - eo, "[rank %u] %s: %.*s\n", client->rank,
						log_keys[k][1], (int)n, l);
				l += n + (l[n] == '\n');
			}
			break;
		}
	}
	ev->status = !ev->msg || !ev->data ? PMIX_ERR_NOMEM : unsupported && !eo && !oo ? PMIX_ERR_NOT_SUPPORTED : PMIX_SUCCESS;
	ev->ndata = oo;
	ev->proc = *client;
	ev->opcb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
}

/* PMIx_Query_info: copied here, answered on the main thread. */
static pmix_status_t up_query(pmix_proc_t *proct, pmix_query_t *queries, size_t nqueries, pmix_info_cbfunc_t cbfunc,
	void *cbdata)
{
	struct srv_event *ev = ev_new(EV_QUERY);
	if (!ev)
		return PMIX_ERR_NOMEM;
	PMIX_QUERY_CREATE(ev->queries, nqueries);
	if (nqueries && !ev->queries) {
		free(ev);
		return PMIX_ERR_NOMEM;
	}
	ev->nqueries = nqueries;
	for (size_t i = 0; i < nqueries; i++) {
		size_t nk = 0;
		while (queries[i].keys && queries[i].keys[nk])
			nk++;
		ev->queries[i].keys = calloc(nk + 1, sizeof(char *));
		for (size_t k = 0; ev->queries[i].keys && k < nk; k++)
			ev->queries[i].keys[k] = strdup(queries[i].keys[k]);
	}
	if (proct)
		ev->proc = *proct;
	ev->infocb = cbfunc;
	ev->cbdata = cbdata;
	post(ev);
	return PMIX_SUCCESS;
}

/* An info every event we deliver from another node carries: such an event
 * is never forwarded again. */
#define FORWARDED_KEY "dptp.xnode.forwarded"

/* code, source, range, ninfo, infos: the event as another node needs it.
 * PMIx_Data_pack is plain serialisation (no thread shift), safe on PMIx's
 * progress thread. */
static int pack_event(pmix_status_t code, const pmix_proc_t *source, pmix_data_range_t range, const pmix_info_t *info,
	size_t n, char **out, size_t *len)
{
	pmix_data_buffer_t buf;
	pmix_byte_object_t bo = {0};
	int bad;
	PMIX_DATA_BUFFER_CONSTRUCT(&buf);
	bad = PMIx_Data_pack(NULL, &buf, &code, 1, PMIX_STATUS) != PMIX_SUCCESS ||
		PMIx_Data_pack(NULL, &buf, (void *)source, 1, PMIX_PROC) != PMIX_SUCCESS ||
		PMIx_Data_pack(NULL, &buf, &range, 1, PMIX_DATA_RANGE) != PMIX_SUCCESS ||
		PMIx_Data_pack(NULL, &buf, &n, 1, PMIX_SIZE) != PMIX_SUCCESS ||
		(n && PMIx_Data_pack(NULL, &buf, (void *)info, (int32_t)n, PMIX_INFO) != PMIX_SUCCESS) ||
		PMIx_Data_unload(&buf, &bo) != PMIX_SUCCESS;
	PMIX_DATA_BUFFER_DESTRUCT(&buf);
	if (bad) {
		PMIX_BYTE_OBJECT_DESTRUCT(&bo);
		return -EIO;
	}
	*out = bo.bytes; /* malloc'd by PMIx */
	*len = bo.size;
	return 0;
}

/* A client's PMIx_Notify_event beyond this node (OpenPMIx delivers it to
 * the local clients itself): packed here and answered at once (the
 * library's completion callback is not for another thread), the blob goes
 * to the sink (the other nodes) on the main thread. */
static pmix_status_t up_notify_event(pmix_status_t code, const pmix_proc_t *source, pmix_data_range_t range,
	pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	struct srv_event *ev;
	(void)cbfunc;
	(void)cbdata;
	if (range == PMIX_RANGE_LOCAL || range == PMIX_RANGE_PROC_LOCAL || range == PMIX_RANGE_RM || !source)
		return PMIX_OPERATION_SUCCEEDED;
	for (size_t i = 0; i < ninfo; i++)
		if (key_is(&info[i], FORWARDED_KEY))
			return PMIX_OPERATION_SUCCEEDED;
	if (!(ev = ev_new(EV_NOTIFY)))
		return PMIX_ERR_NOMEM;
	if (pack_event(code, source, range, info, ninfo, &ev->data, &ev->ndata) < 0) {
		free(ev);
		return PMIX_ERROR;
	}
	ev->status = code;
	ev->proc = *source;
	post(ev);
	return PMIX_OPERATION_SUCCEEDED;
}

int pmix_srv_notify_local(struct pmix_srv *s, const void *blob, size_t len)
{
	pmix_data_buffer_t buf;
	pmix_byte_object_t bo = {.bytes = malloc(len ? len : 1), .size = len};
	pmix_status_t code = 0, rc;
	pmix_proc_t source;
	pmix_data_range_t range;
	pmix_info_t *info = NULL;
	size_t n = 0;
	int32_t one = 1, cnt;
	bool yes = true;
	if (!s->up || !bo.bytes)
		return -EIO;
	memcpy(bo.bytes, blob, len);
	PMIX_DATA_BUFFER_CONSTRUCT(&buf);
	PMIx_Data_load(&buf, &bo); /* takes bo.bytes */
	rc = PMIx_Data_unpack(NULL, &buf, &code, &one, PMIX_STATUS);
	if (rc == PMIX_SUCCESS && (one = 1))
		rc = PMIx_Data_unpack(NULL, &buf, &source, &one, PMIX_PROC);
	if (rc == PMIX_SUCCESS && (one = 1))
		rc = PMIx_Data_unpack(NULL, &buf, &range, &one, PMIX_DATA_RANGE);
	if (rc == PMIX_SUCCESS && (one = 1))
		rc = PMIx_Data_unpack(NULL, &buf, &n, &one, PMIX_SIZE);
	if (rc == PMIX_SUCCESS && n > 1024)
		rc = PMIX_ERR_BAD_PARAM;
	if (rc == PMIX_SUCCESS) {
		PMIX_INFO_CREATE(info, n + 1); /* and the forwarded mark */
		cnt = (int32_t)n;
		if (!info)
			rc = PMIX_ERR_NOMEM;
		else if (n)
			rc = PMIx_Data_unpack(NULL, &buf, info, &cnt, PMIX_INFO);
	}
	PMIX_DATA_BUFFER_DESTRUCT(&buf);
	if (rc == PMIX_SUCCESS) {
		(void)range; /* delivered to this node's clients only */
		PMIX_INFO_LOAD(&info[n], FORWARDED_KEY, &yes, PMIX_BOOL);
		rc = PMIx_Notify_event(code, &source, PMIX_RANGE_LOCAL, info, n + 1, NULL, NULL);
	}
	if (info)
		PMIX_INFO_FREE(info, n + 1);
	return rc == PMIX_SUCCESS || rc == PMIX_OPERATION_SUCCEEDED ? 0 : -EIO;
}

static pmix_server_module_t module = {
	.notify_event = up_notify_event,
	.query = up_query,
	.spawn = up_spawn,
	.job_control = up_job_control,
	.log = up_log,
	.client_connected = up_connected,
	.client_finalized = up_finalized,
	.abort = up_abort,
	.fence_nb = up_fence,
	.direct_modex = up_dmodex,
};

/* cbdata: NULL, or the release generation that posted the operation */
static void opdone(pmix_status_t status, void *cbdata)
{
	struct srv_event *ev = ev_new(EV_OPDONE);
	if (!ev)
		return;
	ev->status = status;
	ev->token = cbdata;
	post(ev);
}

static void release_data(void *cbdata)
{
	free(cbdata);
}

bool pmix_srv_fence_wildcard(const struct pmix_srv_fence *f)
{
	for (size_t i = 0; i < f->ev.nprocs; i++)
		if (f->ev.procs[i].rank == PMIX_RANK_WILDCARD)
			return true;
	return f->ev.nprocs == 0;
}

size_t pmix_srv_fence_nranks(const struct pmix_srv_fence *f)
{
	return f->ev.nprocs;
}

unsigned pmix_srv_fence_rank(const struct pmix_srv_fence *f, size_t i)
{
	return f->ev.procs[i].rank;
}

int pmix_srv_fence_foreign(const struct pmix_srv_fence *f)
{
	for (size_t i = 0; i < f->ev.nprocs; i++)
		if (strncmp(f->ev.procs[i].nspace, f->srv->nspace, PMIX_MAX_NSLEN)) {
			if (getenv("DPTP_RUN_DEBUG"))
				fprintf(stderr, "dptp-run: fence proc %zu nspace '%s' rank %u, ours '%s'\n", i,
					f->ev.procs[i].nspace, f->ev.procs[i].rank, f->srv->nspace);
			return -1;
		}
	return 0;
}

const void *pmix_srv_fence_data(const struct pmix_srv_fence *f, size_t *len)
{
	*len = f->ev.ndata;
	return f->ev.data;
}

static void fence_finish(struct pmix_srv_fence *f, pmix_status_t status, const void *data, size_t len);

void pmix_srv_fence_complete(struct pmix_srv_fence *f, bool ok, const void *data, size_t len)
{
	fence_finish(f, ok ? PMIX_SUCCESS : PMIX_ERROR, data, len);
}

static void fence_finish(struct pmix_srv_fence *f, pmix_status_t status, const void *data, size_t len)
{
	bool ok = status == PMIX_SUCCESS;
	char *copy = NULL;
	if (ok && len) {
		copy = malloc(len);
		if (copy)
			memcpy(copy, data, len);
		else
			ok = false;
	}
	if (f->ev.modexcb && !crash_guard_tripped()) {
		if (ok)
			f->ev.modexcb(PMIX_SUCCESS, copy, copy ? len : 0, f->ev.cbdata, release_data, copy);
		else
			f->ev.modexcb(status == PMIX_SUCCESS ? PMIX_ERR_NOMEM : status, NULL, 0, f->ev.cbdata, NULL, NULL);
		if (!ok || !copy)
			free(copy);
	} else {
		free(copy);
	}
	free(f->ev.procs);
	free(f->ev.data);
	free(f);
}

/* proc's index among this server's clients of the current job, or -1 */
static long local_index(const struct pmix_srv *s, const pmix_proc_t *proc)
{
	if (!s->nspace_registered || strncmp(proc->nspace, s->nspace, PMIX_MAX_NSLEN) || proc->rank < s->base_rank ||
	    proc->rank - s->base_rank >= s->nlocal)
		return -1;
	return (long)(proc->rank - s->base_rank);
}

static struct pmix_srv_proc *proc_of(const struct pmix_srv *s, unsigned rank)
{
	if (!s->procs || rank < s->base_rank || rank - s->base_rank >= s->nlocal)
		return NULL;
	return &s->procs[rank - s->base_rank];
}

enum pmix_srv_client pmix_srv_client_state(const struct pmix_srv *s, unsigned rank)
{
	const struct pmix_srv_proc *p = proc_of(s, rank);
	return p ? p->state : PMIX_SRV_CLIENT_NONE;
}

void pmix_srv_worker_started(struct pmix_srv *s, unsigned rank, pid_t pid, const char *exe)
{
	struct pmix_srv_proc *p = proc_of(s, rank);
	if (!p)
		return;
	p->started = true;
	p->pid = pid;
	snprintf(s->exe, sizeof(s->exe), "%s", exe ? exe : "");
}

void pmix_srv_worker_exited(struct pmix_srv *s, unsigned rank, int exitcode)
{
	struct pmix_srv_proc *p = proc_of(s, rank);
	if (!p)
		return;
	p->exited = true;
	p->exitcode = exitcode;
}

void pmix_srv_remote_pid(struct pmix_srv *s, unsigned rank, pid_t pid)
{
	if (s->rpids && rank < s->world)
		s->rpids[rank] = pid;
}

static const char *const query_keys[] = {
	PMIX_QUERY_NAMESPACES, PMIX_QUERY_JOB_STATUS, PMIX_JOB_SIZE, PMIX_QUERY_PROC_TABLE, PMIX_QUERY_LOCAL_PROC_TABLE,
	PMIX_QUERY_SPAWN_SUPPORT, PMIX_QUERY_DEBUG_SUPPORT, PMIX_QUERY_NUM_PSETS, PMIX_QUERY_PSET_NAMES,
	PMIX_QUERY_NUM_GROUPS, PMIX_QUERY_SUPPORTED_KEYS,
};

/* The job's processes as pmix_proc_info_t: this node's as the launcher
 * saw them, the other nodes' (PMIX_QUERY_PROC_TABLE over several nodes)
 * with their node's name and the pid their launcher published (0 until
 * it did), running while the job runs. PMIX_QUERY_LOCAL_PROC_TABLE lists
 * this node's only. */
static void proc_table(const struct pmix_srv *s, pmix_info_t *out, const char *key)
{
	pmix_data_array_t *da;
	pmix_proc_info_t *pi;
	bool all = s->nodes && strcmp(key, PMIX_QUERY_LOCAL_PROC_TABLE);
	unsigned n = all ? s->world : s->nlocal, first = all ? 0 : s->base_rank, k = 0;
	PMIX_DATA_ARRAY_CREATE(da, n, PMIX_PROC_INFO);
	if (!da)
		return;
	pi = da->array;
	for (unsigned i = 0; i < n && pi; i++) {
		unsigned rank = first + i;
		const struct pmix_srv_proc *p = proc_of(s, rank);
		while (all && k + 1 < s->nnodes && rank >= s->nodes[k].base + s->nodes[k].nproc)
			k++;
		PMIX_LOAD_PROCID(&pi[i].proc, s->nspace, rank);
		pi[i].hostname = strdup(p || !all ? s->hostname : s->nodes[k].host);
		pi[i].executable_name = strdup(s->exe);
		if (!p) {
			pi[i].pid = s->rpids && rank < s->world ? s->rpids[rank] : 0;
			pi[i].state = PMIX_PROC_STATE_RUNNING;
			continue;
		}
		pi[i].pid = p->pid;
		pi[i].exit_code = p->exitcode;
		pi[i].state = !p->started ? PMIX_PROC_STATE_PREPPED : !p->exited ? PMIX_PROC_STATE_RUNNING
			: p->exitcode == 0 && p->state != PMIX_SRV_CLIENT_INIT ? PMIX_PROC_STATE_TERMINATED
			: p->exitcode < 0 ? PMIX_PROC_STATE_ABORTED_BY_SIG : PMIX_PROC_STATE_TERM_NON_ZERO;
	}
	PMIX_INFO_LOAD(out, key, da, PMIX_DATA_ARRAY);
	PMIX_DATA_ARRAY_FREE(da);
}

static void release_infos(void *cbdata)
{
	pmix_data_array_t *da = cbdata;
	PMIX_DATA_ARRAY_FREE(da);
}

/* Answers every key of every query it knows; unknown keys are left out
 * (PMIX_QUERY_PARTIAL_SUCCESS), none known: PMIX_ERR_NOT_FOUND. */
static void answer_query(struct pmix_srv *s, struct srv_event *ev)
{
	size_t nkeys = 0, n = 0, unknown = 0;
	pmix_data_array_t *da;
	pmix_info_t *out;
	char keys[1024] = "";
	for (size_t i = 0; i < ev->nqueries; i++)
		for (size_t k = 0; ev->queries[i].keys && ev->queries[i].keys[k]; k++)
			nkeys++;
	PMIX_DATA_ARRAY_CREATE(da, nkeys ? nkeys : 1, PMIX_INFO);
	if (!da) {
		ev->infocb(PMIX_ERR_NOMEM, NULL, 0, ev->cbdata, NULL, NULL);
		return;
	}
	out = da->array;
	for (size_t i = 0; i < sizeof(query_keys) / sizeof(query_keys[0]); i++)
		snprintf(keys + strlen(keys), sizeof(keys) - strlen(keys), "%s%s", i ? "," : "", query_keys[i]);
	for (size_t i = 0; i < ev->nqueries; i++)
		for (size_t k = 0; ev->queries[i].keys && ev->queries[i].keys[k]; k++) {
			const char *key = ev->queries[i].keys[k];
			uint32_t u32 = 0;
			size_t zero = 0;
			pmix_job_state_t js = PMIX_JOB_STATE_RUNNING;
			if (!strcmp(key, PMIX_QUERY_NAMESPACES))
				PMIX_INFO_LOAD(&out[n++], key, s->nspace_registered ? s->nspace : "", PMIX_STRING);
			else if (!strcmp(key, PMIX_QUERY_JOB_STATUS) && s->nspace_registered)
				PMIX_INFO_LOAD(&out[n++], key, &js, PMIX_JOB_STATE);
			else if (!strcmp(key, PMIX_JOB_SIZE) && s->nspace_registered && (u32 = s->world))
				PMIX_INFO_LOAD(&out[n++], key, &u32, PMIX_UINT32);
			else if ((!strcmp(key, PMIX_QUERY_PROC_TABLE) || !strcmp(key, PMIX_QUERY_LOCAL_PROC_TABLE)) && s->procs)
				proc_table(s, &out[n++], key);
			else if (!strcmp(key, PMIX_QUERY_SPAWN_SUPPORT) || !strcmp(key, PMIX_QUERY_DEBUG_SUPPORT) ||
				 !strcmp(key, PMIX_QUERY_PSET_NAMES))
				PMIX_INFO_LOAD(&out[n++], key, "", PMIX_STRING); /* none */
			else if (!strcmp(key, PMIX_QUERY_NUM_PSETS) || !strcmp(key, PMIX_QUERY_NUM_GROUPS))
				PMIX_INFO_LOAD(&out[n++], key, &zero, PMIX_SIZE);
			else if (!strcmp(key, PMIX_QUERY_SUPPORTED_KEYS))
				PMIX_INFO_LOAD(&out[n++], key, keys, PMIX_STRING);
			else
				unknown++;
		}
	if (!n) {
		PMIX_DATA_ARRAY_FREE(da);
		ev->infocb(PMIX_ERR_NOT_FOUND, NULL, 0, ev->cbdata, NULL, NULL);
		return;
	}
	ev->infocb(unknown ? PMIX_QUERY_PARTIAL_SUCCESS : PMIX_SUCCESS, out, n, ev->cbdata, release_infos, da);
}

/* Completes one event; returns 1 for an EV_OPDONE (status in *st). */
static int complete(struct pmix_srv *s, struct srv_event *ev, const struct pmix_srv_sink *sink, pmix_status_t *st)
{
	int done = 0;
	long li;
	if (ev->type == EV_CRASHED) {
		if (sink && sink->crashed)
			sink->crashed(sink->ctx);
		return 0;
	}
	if (crash_guard_tripped()) {
		/* nothing goes back into a library that crashed: the
		 * callbacks would run its code (and may wait on its locks) */
		if (ev->type == EV_OPDONE) {
			*st = PMIX_ERR_LOST_CONNECTION;
			done = 1;
		}
		if (ev->type == EV_DMODEX_LOCAL)
			free(ev->token);
		goto release;
	}
	switch (ev->type) {
	case EV_OPDONE:
		*st = ev->status;
		done = 1;
		break;
	case EV_FENCE:
		s->fences++;
		((struct pmix_srv_fence *)ev)->srv = s;
		if (pmix_srv_fence_foreign((struct pmix_srv_fence *)ev) < 0) {
			/* this server knows one namespace: a fence naming
			 * another can never complete */
			size_t k = 0;
			while (k + 1 < ev->nprocs && !strncmp(ev->procs[k].nspace, s->nspace, PMIX_MAX_NSLEN))
				k++;
			fprintf(stderr, "dptp-run: error: a fence names namespace '%.*s', not this job's ('%s'); failing it\n",
				PMIX_MAX_NSLEN, ev->procs[k].nspace, s->nspace);
			fence_finish((struct pmix_srv_fence *)ev, PMIX_ERR_NOT_FOUND, NULL, 0);
			return 0;
		}
		if (sink && sink->fence && sink->fence(sink->ctx, (struct pmix_srv_fence *)ev))
			return 0; /* the sink owns it now */
		if (ev->modexcb) {
			ev->modexcb(PMIX_SUCCESS, ev->data, ev->ndata, ev->cbdata, release_data, ev->data);
			ev->data = NULL; /* freed by release_data */
		}
		break;
	case EV_DMODEX:
		if (sink && sink->dmodex && sink->dmodex(sink->ctx, (struct pmix_srv_dmodex *)ev))
			return 0; /* the sink owns it now */
		if (ev->modexcb)
			ev->modexcb(PMIX_ERR_NOT_FOUND, NULL, 0, ev->cbdata, NULL, NULL);
		break;
	case EV_DMODEX_LOCAL:
		if (sink && sink->dmodex_local)
			sink->dmodex_local(sink->ctx, ev->token, ev->status == PMIX_SUCCESS, ev->data, ev->ndata);
		else
			free(ev->token);
		break;
	case EV_CONNECTED:
	case EV_FINALIZED:
		if (ev->type == EV_FINALIZED)
			s->finalized++;
		if (getenv("DPTP_RUN_DEBUG"))
			fprintf(stderr, "dptp-run: client %s:%u %s\n", ev->proc.nspace, ev->proc.rank,
				ev->type == EV_CONNECTED ? "connected" : "finalized");
		if ((li = local_index(s, &ev->proc)) >= 0)
			s->procs[li].state = ev->type == EV_CONNECTED ? PMIX_SRV_CLIENT_INIT : PMIX_SRV_CLIENT_FINALIZED;
		if (ev->opcb)
			ev->opcb(PMIX_SUCCESS, ev->cbdata);
		break;
	case EV_NOTE:
		if (ev->msg && *ev->msg)
			fputs(ev->msg, stderr);
		if (ev->data && ev->ndata) {
			fputs(ev->data, stdout);
			fflush(stdout);
		}
		if (ev->msg && *ev->msg && ev->msg[strlen(ev->msg) - 1] != '\n')
			fputc('\n', stderr);
		if (ev->opcb)
			ev->opcb(ev->status, ev->cbdata);
		break;
	case EV_SPAWN:
		fprintf(stderr, "dptp-run: error: %s\n", ev->msg);
		if (sink && sink->refuse && local_index(s, &ev->proc) >= 0)
			sink->refuse(sink->ctx, ev->proc.rank, ev->msg);
		break;
	case EV_NOTIFY:
		if (getenv("DPTP_RUN_DEBUG"))
			fprintf(stderr, "dptp-run: event %d from rank %u: %zu bytes for the other nodes\n", ev->status,
				ev->proc.rank, ev->ndata);
		if (sink && sink->notify)
			sink->notify(sink->ctx, ev->data, ev->ndata);
		break;
	case EV_QUERY:
		if (ev->infocb)
			answer_query(s, ev);
		PMIX_QUERY_FREE(ev->queries, ev->nqueries);
		break;
	case EV_ABORT:
		/* answered first: stopping the job deregisters the caller, and
		 * OpenPMIx logs an error for a reply to a deregistered client */
		if (ev->opcb)
			ev->opcb(PMIX_SUCCESS, ev->cbdata);
		if (sink && sink->abort && local_index(s, &ev->proc) >= 0)
			sink->abort(sink->ctx, ev->proc.rank, ev->abort_status, ev->msg);
		break;
	case EV_CRASHED: /* handled above */
		break;
	}
release:
	free(ev->msg);
	free(ev->data);
	free(ev->procs);
	free(ev);
	return done;
}

static void stash_push(struct pmix_srv *s, struct srv_event *ev)
{
	ev->next = NULL;
	if (!s->stash_end)
		s->stash_end = &s->stash;
	*s->stash_end = ev;
	s->stash_end = &ev->next;
}

static struct srv_event *stash_pop(struct pmix_srv *s)
{
	struct srv_event *ev = s->stash;
	if (ev && !(s->stash = ev->next))
		s->stash_end = &s->stash;
	return ev;
}

/* Completes the stashed upcalls, oldest first; one of them may stash more
 * (an abort that stops the job waits for deregistrations): they follow. */
static void drain_stash(struct pmix_srv *s, const struct pmix_srv_sink *sink)
{
	struct srv_event *ev;
	pmix_status_t st;
	while ((ev = stash_pop(s)))
		complete(s, ev, sink, &st);
}

bool pmix_srv_pending(const struct pmix_srv *s)
{
	return s->up && s->stash;
}

void pmix_srv_dispatch(struct pmix_srv *s, const struct pmix_srv_sink *sink)
{
	struct srv_event *batch[64];
	ssize_t n;
	pmix_status_t st;
	if (!s->up)
		return;
	drain_stash(s, sink);
	/* what a batch's upcall stashes was read after the rest of the batch */
	while ((n = read(s->evpipe[0], batch, sizeof(batch))) > 0) {
		for (size_t i = 0; i < (size_t)n / sizeof(batch[0]); i++)
			complete(s, batch[i], sink, &st);
		drain_stash(s, sink);
	}
}

/* Waits (bounded) for `count` EV_OPDONE events tagged `tag` (late ones of
 * another tag are dropped). Other upcalls: stash true keeps them, in order,
 * for the next dispatch (during a job, when only the job's sink may
 * complete them); false completes them without a sink (between jobs). */
static int wait_ops_tagged(struct pmix_srv *s, unsigned count, void *tag, bool stash, double timeout, const char *what,
	struct dptp_err *err)
{
	double deadline = dptp_now() + timeout;
	pmix_status_t first_bad = PMIX_SUCCESS;
	if (!stash)
		drain_stash(s, NULL);
	while (count) {
		struct srv_event *ev;
		if (crash_guard_tripped())
			return dptp_err_set(err, -EIO, "pmix %s: the PMIx library crashed", what);
		ssize_t n = read(s->evpipe[0], &ev, sizeof(ev));
		if (n == (ssize_t)sizeof(ev)) {
			pmix_status_t st = PMIX_SUCCESS;
			if (ev->type == EV_OPDONE && ev->token != tag) {
				free(ev);
			} else if (ev->type != EV_OPDONE && stash) {
				stash_push(s, ev);
			} else if (complete(s, ev, NULL, &st)) {
				count--;
				if (st != PMIX_SUCCESS && first_bad == PMIX_SUCCESS)
					first_bad = st;
			}
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return dptp_err_set(err, -errno, "pmix event pipe: %s", strerror(errno));
		double left = deadline - dptp_now();
		if (left <= 0)
			return dptp_err_set(err, -ETIMEDOUT, "pmix %s did not complete within %.0f s", what, timeout);
		struct pollfd pfd = {.fd = s->evpipe[0], .events = POLLIN};
		poll(&pfd, 1, (int)(left * 1000) + 1);
	}
	if (first_bad != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "pmix %s failed: %s", what, PMIx_Error_string(first_bad));
	return 0;
}

/* Waits (bounded) for `count` untagged EV_OPDONE events, completing others. */
static int wait_ops(struct pmix_srv *s, unsigned count, double timeout, const char *what, struct dptp_err *err)
{
	return wait_ops_tagged(s, count, NULL, false, timeout, what, err);
}

/* ds21's metadata segment: one 24-byte entry a rank, so 64 KiB hold 2700
 * ranks (more take another segment). OpenPMIx's default, 4 MiB, is zeroed
 * page by page when the first client connects. Server and clients must
 * agree on it: they read it from the environment (setup_fork). */
#define DS_META_SEG_SIZE "65536"

/* Whether an MCA selection list ("a,b", "^a") lets the hash store in. */
static bool gds_has_hash(const char *list)
{
	const char *p = list;
	size_t n;
	if (*list == '^')
		return !strstr(list, "hash");
	for (; *p; p += n + (p[n] == ',')) {
		n = strcspn(p, ",");
		if (n == 4 && !strncmp(p, "hash", 4))
			return true;
	}
	return false;
}

/* The highest descriptor number open in this process, or -1. */
static int highest_fd(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int top = -1;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && atoi(e->d_name) > top)
			top = atoi(e->d_name);
	closedir(d);
	return top;
}

/* The other half of releasing a live client: OpenPMIx's _deregister_client
 * closes the socket but leaves its receive (and pending send) events
 * registered in libevent. A later connection that the kernel gives the same
 * descriptor number is then never polled (libevent believes the number is
 * registered already and adds nothing to epoll): the next attempt's worker
 * hangs in PMIx_Init. So once clients were released, and again before a job
 * registers, every free number up to the highest one open when they were
 * released is taken by a placeholder (/dev/null, close-on-exec) for the
 * server's lifetime: new connections get numbers the library never used. */
static void hold_released_fds(struct pmix_srv *s)
{
	for (;;) {
		int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		int *v;
		if (fd < 0)
			return;
		if (fd > s->fd_hwm || !(v = realloc(s->fd_holds, (s->nfd_holds + 1) * sizeof(*v)))) {
			close(fd);
			return;
		}
		v[s->nfd_holds++] = fd;
		s->fd_holds = v;
	}
}

static void drop_fd_holds(struct pmix_srv *s)
{
	for (size_t i = 0; i < s->nfd_holds; i++)
		close(s->fd_holds[i]);
	free(s->fd_holds);
	s->fd_holds = NULL;
	s->nfd_holds = 0;
}

int pmix_srv_init(struct pmix_srv *s, void (*made_dir)(void *ctx, const char *dir), void *ctx,
	struct dptp_err *err)
{
	const char *tmp = getenv("TMPDIR");
	pmix_info_t info[6];
	size_t ninfo = 0;
	bool no = false, hwloc_env = false, gds_env = false, meta_env = false;
	const char *gds;
	pmix_status_t rc;

	memset(s, 0, sizeof(*s));
	s->evpipe[0] = s->evpipe[1] = -1;
	if (!tmp || !*tmp)
		tmp = "/tmp";
	snprintf(s->tmpdir, sizeof(s->tmpdir), "%s/dptp-run.XXXXXX", tmp);
	if (!mkdtemp(s->tmpdir)) { /* mkdtemp creates it 0700 */
		int e = errno;
		s->tmpdir[0] = '\0';
		return dptp_err_set(err, -e, "cannot create pmix tmpdir in '%s': %s", tmp, strerror(e));
	}
	/* the caller learns of each folder before anything slow runs here
	 * (PMIx_server_init takes milliseconds): a launcher SIGKILLed in
	 * between left both behind, its guard not knowing them. The /dev/shm
	 * folder takes the tmpdir's name where it can (mkdir never reuses an
	 * existing one), so that the pair is recognisable. */
	if (made_dir)
		made_dir(ctx, s->tmpdir);
	snprintf(s->shmdir, sizeof(s->shmdir), "/dev/shm/%s", strrchr(s->tmpdir, '/') + 1);
	if (mkdir(s->shmdir, 0700) < 0) {
		snprintf(s->shmdir, sizeof(s->shmdir), "/dev/shm/dptp-run.XXXXXX");
		if (!mkdtemp(s->shmdir))
			s->shmdir[0] = '\0';
	}
	if (made_dir && s->shmdir[0])
		made_dir(ctx, s->shmdir);
	if (pipe2(s->evpipe, O_CLOEXEC) < 0) {
		int e = errno;
		pmix_srv_finalize(s);
		return dptp_err_set(err, -e, "pipe: %s", strerror(e));
	}
	fcntl(s->evpipe[0], F_SETFL, O_NONBLOCK);
	ev_write_fd = s->evpipe[1];

	/* hwloc's full discovery (and its libxml2 plugin) costs 15-20 ms; the
	 * server only needs the PU count, which the no_os backend gives in
	 * microseconds. Workers never see these variables. */
	if (!getenv("HWLOC_COMPONENTS") && !getenv("DPTP_RUN_FULL_TOPOLOGY")) {
		setenv("HWLOC_COMPONENTS", "no_os,stop", 1);
		setenv("HWLOC_PLUGINS_PATH", s->tmpdir, 1);
		hwloc_env = true;
	}
	/* job data in the shared-memory datastore (ds21), as mpirun: a
	 * client's get of a peer's fenced data reads shared memory instead of
	 * a round trip through the server's hash store, which costs 8-19x as
	 * much (bench/pmix.py, 4 ranks on 2 cores: get-all 0.024 s against
	 * 0.003 s over 20 rounds; mpirun 0.008 s). The hash store stays for
	 * each process's own data, which the shared-memory stores cannot
	 * hold. Clients learn the choice from PMIX_GDS_MODULE (setup_fork). The segments are
	 * zeroed page by page when the first client connects: they lie in the
	 * private /dev/shm folder (tmpfs; the tmpdir may be on a disk, whose
	 * mapped pages cost more to touch, ~40 %, and are written back) and
	 * the metadata segment is 64 KiB instead of 4 MiB. The data segment
	 * keeps OpenPMIx's 4 MiB: a single value must fit in one (a larger
	 * one crashes OpenPMIx's store in the server, under mpirun too). */
	if ((gds = getenv("PMIX_MCA_gds")) && *gds && !gds_has_hash(gds)) {
		int e = -EINVAL;
		dptp_err_set(err, e, "PMIX_MCA_gds='%s' leaves out 'hash', which every PMIx process needs for its own data "
			"(mpirun fails the same way); add it, e.g. PMIX_MCA_gds=%s,hash", gds, gds);
		pmix_srv_finalize(s);
		return e;
	}
	if (!gds || !*gds) {
		setenv("PMIX_MCA_gds", "ds21,hash", 1);
		gds_env = true;
	}
	if (!getenv("NS_META_SEG_SIZE")) {
		setenv("NS_META_SEG_SIZE", DS_META_SEG_SIZE, 1);
		meta_env = true;
	}
	if (s->shmdir[0]) {
		/* PMIX_DSTPATH (deprecated in 4.x, still the store's own key) */
		PMIX_INFO_LOAD(&info[ninfo], "pmix.dstpath", s->shmdir, PMIX_STRING);
		ninfo++;
	}
	PMIX_INFO_LOAD(&info[ninfo], PMIX_SERVER_TMPDIR, s->tmpdir, PMIX_STRING);
	ninfo++;
	PMIX_INFO_LOAD(&info[ninfo], PMIX_SYSTEM_TMPDIR, s->tmpdir, PMIX_STRING);
	ninfo++;
	/* no shared-memory copy of the topology: clients that want one
	 * discover it themselves */
	PMIX_INFO_LOAD(&info[ninfo], PMIX_SERVER_SHARE_TOPOLOGY, &no, PMIX_BOOL);
	ninfo++;
	PMIX_INFO_LOAD(&info[ninfo], PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
	ninfo++;
	rc = PMIx_server_init(&module, info, ninfo);
	if (hwloc_env) {
		unsetenv("HWLOC_COMPONENTS");
		unsetenv("HWLOC_PLUGINS_PATH");
	}
	if (gds_env)
		unsetenv("PMIX_MCA_gds");
	if (meta_env)
		unsetenv("NS_META_SEG_SIZE");
	for (size_t i = 0; i < ninfo; i++)
		PMIX_INFO_DESTRUCT(&info[i]);
	if (rc != PMIX_SUCCESS) {
		pmix_srv_finalize(s);
		return dptp_err_set(err, -EIO, "PMIx_server_init failed: %s", PMIx_Error_string(rc));
	}
	s->up = true;
	/* where the library lacks executable segments we can find, its
	 * crashes are not contained (crash_guard.h): no reason to refuse */
	(void)crash_guard_install(s->evpipe[1], &crash_ev);
	return 0;
}

static int list_add(void *list, const char *key, const void *val, pmix_data_type_t type)
{
	return PMIx_Info_list_add(list, key, val, type) == PMIX_SUCCESS ? 0 : -ENOMEM;
}

/* "h0,h1,..." and "0,1;2,3": the node and proc maps of the whole job. */
static int job_maps(const struct rdzv_node *nodes, unsigned nnodes, const char *hostname, unsigned base_rank,
	unsigned nlocal, char **hosts, char **procs)
{
	size_t hl = 1, pl = 1, ho = 0, po = 0;
	unsigned world = 0;
	struct rdzv_node one = {.nproc = nlocal, .base = base_rank};
	if (!nodes) {
		nodes = &one;
		nnodes = 1;
	}
	for (unsigned k = 0; k < nnodes; k++) {
		hl += strlen(nodes[k].host[0] ? nodes[k].host : hostname) + 1;
		pl += (size_t)nodes[k].nproc * 12 + 1;
		world += nodes[k].nproc;
	}
	*hosts = malloc(hl);
	*procs = malloc(pl);
	if (!*hosts || !*procs)
		return -ENOMEM;
	**hosts = **procs = '\0';
	for (unsigned k = 0; k < nnodes; k++) {
		ho += (size_t)snprintf(*hosts + ho, hl - ho, "%s%s", k ? "," : "", nodes[k].host[0] ? nodes[k].host : hostname);
		for (unsigned i = 0; i < nodes[k].nproc; i++)
			po += (size_t)snprintf(*procs + po, pl - po, "%s%u", i ? "," : k ? ";" : "", nodes[k].base + i);
	}
	(void)world;
	return 0;
}

/* Keeps what the server answers for from the job: its nspace, this node's
 * share of the ranks, the nodes and the universe as mpirun counts it
 * (every node's slots). -ENOMEM. */
static int job_keep(struct pmix_srv *s, const char *nspace, unsigned nlocal, unsigned base_rank, unsigned world,
	const char *hostname, const struct rdzv_node *nodes, unsigned nnodes)
{
	snprintf(s->nspace, sizeof(s->nspace), "%s", nspace);
	snprintf(s->hostname, sizeof(s->hostname), "%s", hostname);
	s->nlocal = nlocal;
	s->base_rank = base_rank;
	s->world = world;
	free(s->procs);
	free(s->nodes);
	free(s->rpids);
	s->nodes = NULL;
	s->rpids = NULL;
	s->nnodes = 0;
	if (!(s->procs = calloc(nlocal ? nlocal : 1, sizeof(*s->procs))))
		return -ENOMEM;
	s->univ = s->slots ? s->slots : nlocal;
	if (nodes) {
		if (!(s->nodes = calloc(nnodes, sizeof(*nodes))) || !(s->rpids = calloc(world ? world : 1, sizeof(pid_t))))
			return -ENOMEM;
		memcpy(s->nodes, nodes, nnodes * sizeof(*nodes));
		s->nnodes = nnodes;
		s->univ = 0;
		for (unsigned k = 0; k < nnodes; k++)
			s->univ += nodes[k].slots ? nodes[k].slots : nodes[k].nproc;
	}
	return 0;
}

/* This node's ranks, "3,4,5" (PMIX_LOCAL_PEERS); NULL when out of memory. */
static char *local_peers(unsigned nlocal, unsigned base_rank)
{
	size_t plen = (size_t)nlocal * 12 + 1, off = 0;
	char *peers = malloc(plen);
	if (!peers)
		return NULL;
	peers[0] = '\0';
	for (unsigned i = 0; i < nlocal; i++)
		off += (size_t)snprintf(peers + off, plen - off, "%s%u", i ? "," : "", base_rank + i);
	return peers;
}

/* The job-level keys of the nspace. Non-zero when out of memory. */
static int job_info_add(const struct pmix_srv *s, void *list, const char *nspace, unsigned nlocal, unsigned base_rank,
	unsigned world, unsigned nnodes_or_1, const char *peers, const char *regex, const char *ppn)
{
	uint32_t u32;
	pmix_rank_t rk;
	bool f = false;

	u32 = s->univ;
	if (list_add(list, PMIX_UNIV_SIZE, &u32, PMIX_UINT32))
		return 1;
	u32 = world;
	if (list_add(list, PMIX_JOB_SIZE, &u32, PMIX_UINT32) ||
	    list_add(list, PMIX_MAX_PROCS, &u32, PMIX_UINT32) || list_add(list, PMIX_APP_SIZE, &u32, PMIX_UINT32))
		return 1;
	u32 = nlocal;
	if (list_add(list, PMIX_LOCAL_SIZE, &u32, PMIX_UINT32) || list_add(list, PMIX_NODE_SIZE, &u32, PMIX_UINT32))
		return 1;
	u32 = 1;
	if (list_add(list, PMIX_JOB_NUM_APPS, &u32, PMIX_UINT32))
		return 1;
	u32 = nnodes_or_1;
	if (list_add(list, PMIX_NUM_NODES, &u32, PMIX_UINT32))
		return 1;
	rk = base_rank;
	if (list_add(list, PMIX_LOCALLDR, &rk, PMIX_PROC_RANK))
		return 1;
	rk = 0;
	if (list_add(list, PMIX_APPLDR, &rk, PMIX_PROC_RANK))
		return 1;
	return list_add(list, PMIX_LOCAL_PEERS, peers, PMIX_STRING) || list_add(list, PMIX_NODE_MAP, regex, PMIX_REGEX) ||
	       list_add(list, PMIX_PROC_MAP, ppn, PMIX_REGEX) || list_add(list, PMIX_JOBID, nspace, PMIX_STRING) ||
	       list_add(list, PMIX_SPAWNED, &f, PMIX_BOOL);
}

/* One PMIX_PROC_DATA array per local rank. Non-zero when out of memory. */
static int proc_info_add(void *list, unsigned nlocal, unsigned base_rank, uint32_t nodeid, const char *hostname)
{
	for (unsigned i = 0; i < nlocal; i++) {
		void *pl = PMIx_Info_list_start();
		pmix_data_array_t pd = PMIX_DATA_ARRAY_STATIC_INIT;
		pmix_rank_t r = base_rank + i;
		uint16_t lr = (uint16_t)i;
		uint32_t zero = 0;
		int bad;
		if (!pl)
			return 1;
		bad = list_add(pl, PMIX_RANK, &r, PMIX_PROC_RANK) || list_add(pl, PMIX_APPNUM, &zero, PMIX_UINT32) ||
			list_add(pl, PMIX_APP_RANK, &r, PMIX_PROC_RANK) || list_add(pl, PMIX_GLOBAL_RANK, &r, PMIX_PROC_RANK) ||
			list_add(pl, PMIX_LOCAL_RANK, &lr, PMIX_UINT16) || list_add(pl, PMIX_NODE_RANK, &lr, PMIX_UINT16) ||
			list_add(pl, PMIX_NODEID, &nodeid, PMIX_UINT32) || list_add(pl, PMIX_HOSTNAME, hostname, PMIX_STRING) ||
			PMIx_Info_list_convert(pl, &pd) != PMIX_SUCCESS ||
			list_add(list, PMIX_PROC_DATA, &pd, PMIX_DATA_ARRAY);
		PMIX_DATA_ARRAY_DESTRUCT(&pd);
		PMIx_Info_list_release(pl);
		if (bad)
			return 1;
	}
	return 0;
}

/* How long a registration of n ranks may take: 10 s, plus 1 ms per rank
 * (the library encodes the job's map and every rank's data on its progress
 * thread, which shares the host with every other busy process: 2048
 * one-worker nodes on two cores saw nspace registrations pass 10 s). */
static double reg_bound(unsigned n)
{
	return 10.0 + 0.001 * (double)n;
}

/* Every client is registered before any of them is forked. */
static int register_clients(struct pmix_srv *s, const char *nspace, unsigned nlocal, unsigned base_rank, uid_t uid,
	gid_t gid, struct dptp_err *err)
{
	unsigned submitted = 0;
	for (unsigned i = 0; i < nlocal; i++) {
		pmix_proc_t proc;
		PMIX_LOAD_PROCID(&proc, nspace, base_rank + i);
		pmix_status_t rc = PMIx_server_register_client(&proc, uid, gid, NULL, opdone, NULL);
		if (rc == PMIX_SUCCESS)
			submitted++;
		else if (rc != PMIX_OPERATION_SUCCEEDED) {
			wait_ops(s, submitted, reg_bound(nlocal), "client registration", err);
			return dptp_err_set(err, -EIO, "PMIx_server_register_client(rank %u) failed: %s", base_rank + i,
					    PMIx_Error_string(rc));
		}
	}
	return wait_ops(s, submitted, reg_bound(nlocal), "client registration", err);
}

int pmix_srv_register_job(struct pmix_srv *s, const char *nspace, unsigned nlocal,
	unsigned base_rank, unsigned world, const char *hostname, uid_t uid, gid_t gid,
	const struct rdzv_node *nodes, unsigned nnodes, unsigned my_node,
	struct dptp_err *err)
{
	char *hostlist = NULL, *proclist = NULL;
	void *list = NULL;
	pmix_data_array_t darray = PMIX_DATA_ARRAY_STATIC_INIT;
	char *peers = NULL, *regex = NULL, *ppn = NULL;
	pmix_status_t rc;
	int ret = -ENOMEM;
	unsigned submitted = 0;

	if (!s->up)
		return dptp_err_set(err, -ENOTCONN, "pmix server is not running");
	if (s->fd_hwm > 0)
		hold_released_fds(s);
	if (job_keep(s, nspace, nlocal, base_rank, world, hostname, nodes, nnodes) < 0)
		goto nomem;

	if (!(peers = local_peers(nlocal, base_rank)))
		goto nomem;
	if (job_maps(nodes, nnodes, hostname, base_rank, nlocal, &hostlist, &proclist) < 0)
		goto nomem;
	if (PMIx_generate_regex(hostlist, &regex) != PMIX_SUCCESS || PMIx_generate_ppn(proclist, &ppn) != PMIX_SUCCESS) {
		ret = dptp_err_set(err, -EIO, "pmix cannot encode the node/proc map of '%s'", hostlist);
		goto out;
	}

	list = PMIx_Info_list_start();
	if (!list || job_info_add(s, list, nspace, nlocal, base_rank, world, nodes ? nnodes : 1, peers, regex, ppn) ||
	    proc_info_add(list, nlocal, base_rank, nodes ? my_node : 0, hostname) ||
	    PMIx_Info_list_convert(list, &darray) != PMIX_SUCCESS)
		goto nomem;

	rc = PMIx_server_register_nspace(nspace, (int)nlocal, (pmix_info_t *)darray.array, darray.size, opdone, NULL);
	if (rc == PMIX_SUCCESS)
		submitted++;
	else if (rc != PMIX_OPERATION_SUCCEEDED) {
		ret = dptp_err_set(err, -EIO, "PMIx_server_register_nspace('%s') failed: %s", nspace, PMIx_Error_string(rc));
		goto out;
	}
	if ((ret = wait_ops(s, submitted, reg_bound(world + nnodes), "nspace registration", err)) < 0)
		goto out;
	s->nspace_registered = true;
	ret = register_clients(s, nspace, nlocal, base_rank, uid, gid, err);
	goto out;
nomem:
	ret = dptp_err_set(err, -ENOMEM, "out of memory building the pmix job description");
out:
	if (darray.array)
		PMIX_DATA_ARRAY_DESTRUCT(&darray);
	if (list)
		PMIx_Info_list_release(list);
	free(regex);
	free(ppn);
	free(peers);
	free(hostlist);
	free(proclist);
	return ret;
}

/* Appends name=value to the argv-style *env unless name is there already. */
static int env_add(char ***env, const char *name, const char *value)
{
	size_t n = 0, len = strlen(name);
	char **v, *kv;
	for (; *env && (*env)[n]; n++)
		if (!strncmp((*env)[n], name, len) && (*env)[n][len] == '=')
			return 0;
	if (asprintf(&kv, "%s=%s", name, value) < 0)
		return -ENOMEM;
	if (!(v = realloc(*env, (n + 2) * sizeof(*v)))) {
		free(kv);
		return -ENOMEM;
	}
	v[n] = kv;
	v[n + 1] = NULL;
	*env = v;
	return 0;
}

/* name=number, replacing any value *env had. */
static int env_num(char ***env, const char *name, unsigned v)
{
	char num[16];
	size_t len = strlen(name);
	for (size_t i = 0; *env && (*env)[i]; i++)
		if (!strncmp((*env)[i], name, len) && (*env)[i][len] == '=') {
			char *kv;
			if (asprintf(&kv, "%s=%u", name, v) < 0)
				return -ENOMEM;
			free((*env)[i]);
			(*env)[i] = kv;
			return 0;
		}
	snprintf(num, sizeof(num), "%u", v);
	return env_add(env, name, num);
}

int pmix_srv_setup_fork(struct pmix_srv *s, unsigned rank, char ***env, struct dptp_err *err)
{
	pmix_proc_t proc;
	pmix_status_t rc;
	if (!s->up || !s->nspace_registered) {
		/* no server for these workers (a mixed job, or none could
		 * start): Open MPI must fail in MPI_Init, not start a world of
		 * one process that "succeeds" (mpirun's own setting) */
		if (env_add(env, "OMPI_MCA_schizo", "^orte") < 0 || env_add(env, "OMPI_MCA_ess", "^singleton") < 0)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		return 0;
	}
	PMIX_LOAD_PROCID(&proc, s->nspace, rank);
	rc = PMIx_server_setup_fork(&proc, env);
	if (rc != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "PMIx_server_setup_fork(rank %u) failed: %s", rank, PMIx_Error_string(rc));
	/* Open MPI 4.x decides how it was started in its schizo framework:
	 * mpirun/orted, Slurm, jsm and flux each have a component; when none
	 * claims the process, the "orte" component declares an unmanaged
	 * singleton and forces ess=singleton, never asking our server.
	 * Without that component the ess framework picks by priority: "pmi"
	 * (35) wins over "singleton" (25) as soon as the PMIx client finds
	 * its server, and "^singleton" (what mpirun itself sets) turns a
	 * failed connection into an MPI_Init error instead of a silent
	 * one-process world. A user's own settings stay. Open MPI 5 has no
	 * schizo in the application: it asks PMIx_Init first. */
	if (env_add(env, "OMPI_MCA_schizo", "^orte") < 0 || env_add(env, "OMPI_MCA_ess", "^singleton") < 0 ||
	    env_add(env, "NS_META_SEG_SIZE", getenv("NS_META_SEG_SIZE") ? getenv("NS_META_SEG_SIZE") : DS_META_SEG_SIZE) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	/* what else mpirun tells its processes: the OMPI_COMM_WORLD_* and
	 * universe variables (theirs, replacing an outer job's), yielding
	 * when ranks outnumber the node's cores (busy polling ranks that
	 * share a core make every collective ~1000x slower), the session
	 * directory inside the private tmpdir and the shared-memory backing
	 * files in the launcher's own /dev/shm folder: both go with the job,
	 * however it ends, and two nodes on one machine never meet there */
	unsigned lr = rank - s->base_rank;
	if (env_num(env, "OMPI_COMM_WORLD_SIZE", s->world) < 0 || env_num(env, "OMPI_COMM_WORLD_RANK", rank) < 0 ||
	    env_num(env, "OMPI_COMM_WORLD_LOCAL_RANK", lr) < 0 || env_num(env, "OMPI_COMM_WORLD_LOCAL_SIZE", s->nlocal) < 0 ||
	    env_num(env, "OMPI_COMM_WORLD_NODE_RANK", lr) < 0 || env_num(env, "OMPI_UNIVERSE_SIZE", s->univ) < 0 ||
	    env_add(env, "OMPI_MCA_mpi_oversubscribe", s->slots && s->nlocal > s->slots ? "1" : "0") < 0 ||
	    env_add(env, "OMPI_MCA_orte_tmpdir_base", s->tmpdir) < 0 ||
	    (s->shmdir[0] && env_add(env, "OMPI_MCA_btl_vader_backing_directory", s->shmdir) < 0))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	return 0;
}

void pmix_srv_deregister_job(struct pmix_srv *s)
{
	struct dptp_err err = {0};
	if (!s->up || !s->nspace_registered)
		return;
	/* also deregisters the nspace's clients */
	if (!crash_guard_tripped()) {
		PMIx_server_deregister_nspace(s->nspace, opdone, NULL);
		wait_ops(s, 1, reg_bound(s->world + s->nnodes), "nspace deregistration", &err);
	}
	s->nspace_registered = false;
	free(s->procs);
	s->procs = NULL;
	free(s->rpids);
	s->rpids = NULL;
}

/* Why the launcher deregisters a worker's client before it signals it.
 * OpenPMIx (4.2.2 and 5.0: lost_connection in ptl_base_sendrecv.c) adjusts
 * every collective a client takes part in when its connection drops: once
 * the node-local participants left have all contributed, it completes the
 * collective (modex_cbfunc, which the progress thread runs as _mdxcbfunc
 * later in the same pass). Until that has run, the collective is still
 * listed and not marked as handed to the host, so every further
 * participant whose connection drops in the same pass completes it again:
 * the second _mdxcbfunc runs on the freed tracker (event_del on freed
 * memory, a SIGSEGV of the launcher, or a double free). A worker that dies
 * mid-fence opens that window, and the launcher used to signal all the
 * others at once, whose connections then dropped together. A deregistered
 * client's connection is closed by the library itself, which takes it out
 * of its event loop: that worker's death is no lost connection any more. */
void pmix_srv_release_client(struct pmix_srv *s, unsigned rank)
{
	struct pmix_srv_proc *p = proc_of(s, rank);
	pmix_proc_t proc;
	int top;
	if (!s->up || !s->nspace_registered || !p || p->released || crash_guard_tripped())
		return;
	if (!s->release_gen)
		s->release_gen = 1;
	if (!s->releasing && (top = highest_fd()) > s->fd_hwm)
		s->fd_hwm = top;
	PMIX_LOAD_PROCID(&proc, s->nspace, rank);
	/* always calls back; runs the cleanup the client registered */
	PMIx_server_deregister_client(&proc, opdone, (void *)s->release_gen);
	p->released = true;
	s->releasing++;
}

int pmix_srv_wait_released(struct pmix_srv *s, double timeout, struct dptp_err *err)
{
	int rc;
	if (!s->releasing)
		return 0;
	rc = wait_ops_tagged(s, s->releasing, (void *)s->release_gen, true, timeout, "client deregistration", err);
	s->releasing = 0;
	s->release_gen++; /* a late callback of this round is not counted in the next */
	hold_released_fds(s); /* the numbers just closed, before anything else takes one */
	return rc;
}

static void release_clients(struct pmix_srv *s)
{
	struct dptp_err err = {0};
	if (!s->up || !s->nspace_registered || crash_guard_tripped())
		return;
	/* a client killed mid-job may not have been noticed yet by the
	 * progress thread; deregistering it there, after whatever it still
	 * has queued, runs its epilog now instead of never */
	for (unsigned i = 0; i < s->nlocal; i++)
		pmix_srv_release_client(s, s->base_rank + i);
	if (pmix_srv_wait_released(s, 3.0, &err) < 0)
		fprintf(stderr, "dptp-run: warning: %s; files the workers registered for cleanup may remain\n", err.msg);
	drain_stash(s, NULL); /* the job is over: what came meanwhile has no sink */
}

int pmix_srv_fd(const struct pmix_srv *s)
{
	return s->up ? s->evpipe[0] : -1;
}

static void remove_dirs(struct pmix_srv *s)
{
	if (s->tmpdir[0]) {
		dptp_rm_tree(s->tmpdir);
		s->tmpdir[0] = '\0';
	}
	if (s->shmdir[0]) {
		dptp_rm_tree(s->shmdir);
		s->shmdir[0] = '\0';
	}
	free(s->nodes);
	s->nodes = NULL;
}

void pmix_srv_abandon(struct pmix_srv *s)
{
	/* after workers died mid-protocol, PMIx_server_finalize can deadlock
	 * on its own locks (seen: a futex never released after a worker exit
	 * during a fence) or crash; the process is about to exit, so leave
	 * the library be and remove only what would outlive us */
	if (!s)
		return;
	/* but the workers' registered cleanup (Open MPI's /dev/shm segments)
	 * must run: the progress thread may not have seen every lost
	 * connection yet; deregistering the clients there runs their epilogs
	 * (a bounded wait: a stuck library costs 3 s, not a hang) */
	release_clients(s);
	drop_fd_holds(s);
	free(s->procs);
	s->procs = NULL;
	free(s->rpids);
	s->rpids = NULL;
	remove_dirs(s);
}

void pmix_srv_finalize(struct pmix_srv *s)
{
	if (!s)
		return;
	if (s->up) {
		struct srv_event *ev;
		if (!crash_guard_tripped()) {
			crash_guard_remove();
			PMIx_server_finalize();
		}
		s->up = false;
		/* upcalls that raced the shutdown: free them, their library is gone */
		while ((ev = stash_pop(s)) || read(s->evpipe[0], &ev, sizeof(ev)) == (ssize_t)sizeof(ev)) {
			if (ev == &crash_ev)
				continue;
			free(ev->msg);
			free(ev->data);
			free(ev->procs);
			free(ev);
		}
	}
	ev_write_fd = -1;
	drop_fd_holds(s);
	free(s->procs);
	s->procs = NULL;
	for (int i = 0; i < 2; i++)
		if (s->evpipe[i] >= 0) {
			close(s->evpipe[i]);
			s->evpipe[i] = -1;
		}
	free(s->rpids);
	s->rpids = NULL;
	remove_dirs(s);
}
