/* Cross-node PMIx fences over the store (see xnode.h). */
#include "pmix/xnode.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log/glog.h"
#include "wire/tcpstore.h"

enum xstate { X_ADD, X_WAIT, X_MGET, X_WATCH, X_QWAIT, X_QPOP, X_RWAIT, X_RGET, X_DADD, X_DWAIT, X_HB, X_PADD, X_PWAIT, X_PGET, X_PROBE };

struct xop {
	int fd;
	enum xstate st;
	struct dptp_buf out; /* requests not sent yet from outoff on */
	uint8_t *in;
	size_t outoff, inlen, incap;
	double deadline;
	bool echo; /* the PING echo is still to come */
	bool probe; /* its echo tells that the store answers (store_answered) */
	struct pmix_srv_fence *fence; /* NULL: the failure watch */
	struct pmix_srv_dmodex *dmdx; /* X_RWAIT, X_RGET */
	unsigned *inv;
	size_t ninv;
	char base[192];
};

struct seqent {
	char sig[24];
	unsigned long n;
};

struct xnode {
	char host[256];
	unsigned port;
	char prefix[128];
	const struct rdzv_node *nodes;
	unsigned nnodes, me;
	double timeout;
	struct xop *ops[XNODE_MAX_FDS];
	size_t nops;
	struct seqent *seqs;
	size_t nseqs;
	unsigned long count;
	int failed_node;
	struct pmix_srv *srv;
	struct xop *serve; /* pops other nodes' direct-modex requests */
	int finish; /* 0 not asked, 1 waiting for the other nodes, 2 all done */
	unsigned long dmdx_id;
	/* liveness: every hb_interval s this node ADDs 1 to <prefix>hb/<me>
	 * and reads the counters of the next XNODE_HB_WATCH nodes in a ring
	 * (ADD 0); a node whose counter has not moved for hb_timeout s is lost
	 * (this node reports the failed attempt, which every node watches),
	 * and so is the store (node 0's, or the c10d endpoint) when it leaves a
	 * round unanswered as long. O(1) operations per node and round: the
	 * store's host serves O(N) per round, not O(N^2) (every node reading
	 * every counter). */
	struct xop *hb;
	unsigned hb_watch[XNODE_HB_WATCH], hb_nwatch;
	double hb_interval, hb_timeout, hb_next, hb_sent;
	bool hb_waiting;
	uint64_t *hb_val;
	double *hb_seen;
	int lost;          /* the lost node, -1 none */
	/* the store's liveness (static and c10d): a connection to it that
	 * breaks (closed, reset), a heartbeat round unanswered for hb_timeout
	 * s, or a rendezvous request it left unanswered (xnode_store_doubt),
	 * puts it in doubt from store_since on. Then a fresh connection (a
	 * probe: the failure watch opened again if it was lost; none while a
	 * heartbeat round is out) every probe_iv s; its PING echo or any
	 * reply, however late, ends the doubt and opens again what was lost.
	 * The store is gone after gone_after s in doubt with the last probe
	 * refused or broken, or silent_after s with a probe (or the heartbeat
	 * round) unanswered for gone_after s: a loaded store's host answers
	 * late, it does not refuse nor close. */
	struct xop *watch, *probe;
	double store_since, probe_iv, gone_after, silent_after, probe_next, probe_sent;
	bool probe_failed, beats, told_back, doubt_quiet;
	char store_why[96];
	char gone_why[160]; /* "" while the store is not found gone */
	char dial_why[96]; /* why the last dial() failed */
	char lost_why[160];
};

_Static_assert(XNODE_HB_WATCH >= 1, "a node watches a node");

struct dmdx_token {
	unsigned from;
	unsigned long id;
};

__attribute__((format(printf, 2, 3)))
static void xlog_at(char level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	glog_vlog(level, fmt, ap);
	va_end(ap);
}

#define xlog(...) xlog_at('E', __VA_ARGS__)

/* ---- frames ---- */

/* Request frames (wire/tcpstore.h) onto o->out: 0, or -ENOMEM from the
 * first allocation that failed on. */
static int put_ok(const struct xop *o) { return o->out.oom ? -ENOMEM : 0; }
static int put_u8(struct xop *o, uint8_t v) { dptp_tcpstore_frame_u8(&o->out, v); return put_ok(o); }
static int put_u64(struct xop *o, uint64_t v) { dptp_tcpstore_frame_u64(&o->out, v); return put_ok(o); }
static int put_str(struct xop *o, const void *p, size_t n) { dptp_tcpstore_frame_str(&o->out, p, n); return put_ok(o); }

static int handshake(struct xop *o)
{
	dptp_tcpstore_frame_handshake(&o->out, (uint32_t)getpid());
	return put_ok(o);
}

static int frame_set(struct xop *o, const char *key, const void *v, size_t n)
{
	dptp_tcpstore_frame_set(&o->out, key, v, n);
	return put_ok(o);
}

static int frame_wait(struct xop *o, const char *key)
{
	dptp_tcpstore_frame_wait(&o->out, key);
	return put_ok(o);
}

/* ---- connections ---- */

static int dial(struct xnode *x)
{
	char service[16];
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
	int fd = -1;
	char plain[256];
	snprintf(service, sizeof(service), "%u", x->port);
	if (getaddrinfo(dptp_host_unbracket(x->host, plain, sizeof(plain)), service, &hints, &res) != 0) {
		snprintf(x->dial_why, sizeof(x->dial_why), "cannot resolve the host");
		return -EHOSTUNREACH;
	}
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			snprintf(x->dial_why, sizeof(x->dial_why), "socket: %s", strerror(errno));
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
			snprintf(x->dial_why, sizeof(x->dial_why), "connect: %s", strerror(errno));
			close(fd);
			fd = -1;
			continue;
		}
		/* not waited for: the requests queued on the op go out once the
		 * connection is up (POLLOUT), a failed one ends the op as any
		 * error on it does. When thousands of nodes open their links at
		 * once, the store's accept queue overflows and a dropped SYN is
		 * sent again after 1, 3, 7... s: a bounded wait here (5 s, then
		 * 10 s) failed 235, then 78-117 of 2048 nodes on 2 cores, and
		 * held this node's loop (heartbeats included) meanwhile */
	}
	freeaddrinfo(res);
	return fd >= 0 ? fd : -ECONNREFUSED;
}

static void op_free(struct xop *o)
{
	if (o->fd >= 0)
		close(o->fd);
	dptp_buf_release(&o->out);
	free(o->in);
	free(o->inv);
	free(o);
}

static void op_fail(struct xop *o, const char *why)
{
	if (o->st == X_DADD || o->st == X_DWAIT)
		xlog("waiting for the other nodes' workers: %s", why);
	if (o->dmdx) {
		xlog("direct modex %s failed: %s", o->base, why);
		pmix_srv_dmodex_complete(o->dmdx, false, NULL, 0);
		o->dmdx = NULL;
	}
	if (o->fence) {
		xlog("cross-node fence %s failed: %s", o->base, why);
		pmix_srv_fence_complete(o->fence, false, NULL, 0);
		o->fence = NULL;
	}
	op_free(o);
}

static struct xop *op_new(struct xnode *x, double timeout)
{
	struct xop *o;
	snprintf(x->dial_why, sizeof(x->dial_why), "out of memory");
	if (x->nops >= XNODE_MAX_FDS) {
		snprintf(x->dial_why, sizeof(x->dial_why), "%d connections to the store at once", XNODE_MAX_FDS);
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->fd = dial(x);
	if (o->fd < 0 || handshake(o) < 0) {
		op_free(o);
		return NULL;
	}
	o->deadline = timeout > 0 ? dptp_now() + timeout : 0;
	o->echo = true;
	x->ops[x->nops++] = o;
	return o;
}

static int qkey(const struct xnode *x, unsigned node, char *key, size_t len)
{
	return snprintf(key, len, "%sdmodex/%u/queue", x->prefix, node);
}

/* A connection waiting on key in state st (the failure watch, the
 * direct-modex queue), or NULL (x->dial_why says why). */
static struct xop *open_wait(struct xnode *x, const char *key, enum xstate st)
{
	struct xop *o = op_new(x, 0);
	if (o && frame_wait(o, key) < 0) {
		x->nops--;
		op_free(o);
		snprintf(x->dial_why, sizeof(x->dial_why), "out of memory");
		return NULL;
	}
	if (o)
		o->st = st;
	return o;
}

static struct xop *open_watch(struct xnode *x)
{
	char key[192];
	snprintf(key, sizeof(key), "%sfailed", x->prefix);
	return open_wait(x, key, X_WATCH);
}

static struct xop *open_serve(struct xnode *x)
{
	char key[192];
	qkey(x, x->me, key, sizeof(key));
	return open_wait(x, key, X_QWAIT);
}

/* The heartbeat connection, its rounds from now on. */
static struct xop *open_hb(struct xnode *x, double now)
{
	struct xop *o = op_new(x, 0);
	if (!o)
		return NULL;
	o->st = X_HB;
	x->hb_waiting = false;
	x->hb_next = now;
	for (unsigned k = 0; k < x->nnodes; k++)
		x->hb_seen[k] = now;
	return o;
}

int xnode_start(struct xnode **out, const char *host, unsigned port, const char *prefix,
	const struct rdzv_node *nodes, unsigned nnodes, unsigned me, double timeout, double hb_interval,
	double hb_timeout, struct pmix_srv *srv, struct dptp_err *err)
{
	struct xnode *x = calloc(1, sizeof(*x));
	char key[192];
	*out = NULL;
	if (!x)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	snprintf(x->host, sizeof(x->host), "%s", host);
	snprintf(x->prefix, sizeof(x->prefix), "%s", prefix);
	x->port = port;
	x->nodes = nodes;
	x->nnodes = nnodes;
	x->me = me;
	x->timeout = timeout;
	x->failed_node = -1;
	x->lost = -1;
	x->srv = srv;
	x->probe_iv = hb_interval;
	x->gone_after = x->silent_after = hb_timeout;
	x->watch = open_watch(x);
	x->serve = x->watch ? open_serve(x) : NULL;
	if (!x->serve) { /* the key of the one that failed */
		if (x->watch)
			qkey(x, me, key, sizeof(key));
		else
			snprintf(key, sizeof(key), "%sfailed", prefix);
		int rc = dptp_err_set(err, -ECONNREFUSED, "cannot watch %s on the store at %s:%u: %s", key, host, port,
			x->dial_why);
		xnode_stop(x);
		return rc;
	}
	if (hb_interval > 0) {
		x->hb_interval = hb_interval;
		x->hb_timeout = hb_timeout;
		x->beats = true;
		x->hb_val = calloc(nnodes, sizeof(*x->hb_val));
		x->hb_seen = calloc(nnodes, sizeof(*x->hb_seen));
		if (!x->hb_val || !x->hb_seen || !(x->hb = open_hb(x, dptp_now()))) {
			xnode_stop(x);
			return dptp_err_set(err, -ECONNREFUSED, "cannot send heartbeats to the store at %s:%u", host, port);
		}
		for (unsigned i = 0; i < XNODE_HB_WATCH && i + 1 < nnodes; i++)
			x->hb_watch[x->hb_nwatch++] = (me + 1 + i) % nnodes;
	}
	*out = x;
	return 0;
}

void xnode_stop(struct xnode *x)
{
	if (!x)
		return;
	for (size_t i = 0; i < x->nops; i++)
		op_fail(x->ops[i], "the attempt ended");
	free(x->seqs);
	free(x->hb_val);
	free(x->hb_seen);
	free(x);
}

unsigned long xnode_count(const struct xnode *x)
{
	return x ? x->count : 0;
}

static int node_of(const struct xnode *x, unsigned rank)
{
	for (unsigned k = 0; k < x->nnodes; k++)
		if (rank >= x->nodes[k].base && rank < x->nodes[k].base + x->nodes[k].nproc)
			return (int)k;
	return -1;
}

static int cmp_u(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	return x < y ? -1 : x > y;
}

void xnode_fence(struct xnode *x, struct pmix_srv_fence *f)
{
	bool *in = calloc(x->nnodes, sizeof(bool));
	size_t nr = pmix_srv_fence_nranks(f), ninv = 0, dlen;
	unsigned *ranks = NULL;
	char sig[24], key[256];
	const void *data = pmix_srv_fence_data(f, &dlen);
	struct xop *o;
	if (getenv("DPTP_RUN_DEBUG"))
		fprintf(stderr, "dptp-run: node %u fence upcall over %zu proc(s)%s, %zu bytes\n", x->me, nr,
			pmix_srv_fence_wildcard(f) ? " (wildcard)" : "", dlen);
	if (!in)
		goto fail;
	if (pmix_srv_fence_foreign(f) < 0) {
		xlog("a fence over another namespace's processes cannot cross nodes; failing it");
		goto fail;
	}
	if (pmix_srv_fence_wildcard(f)) {
		for (unsigned k = 0; k < x->nnodes; k++)
			in[k] = true;
		snprintf(sig, sizeof(sig), "all");
	} else {
		uint64_t h = 1469598103934665603ull;
		ranks = malloc(nr * sizeof(*ranks));
		if (!ranks)
			goto fail;
		for (size_t i = 0; i < nr; i++) {
			int k = node_of(x, ranks[i] = pmix_srv_fence_rank(f, i));
			if (k < 0) {
				xlog("fence over rank %u, which no node of the job holds; failing it", ranks[i]);
				goto fail;
			}
			in[k] = true;
		}
		qsort(ranks, nr, sizeof(*ranks), cmp_u);
		for (size_t i = 0; i < nr; i++)
			for (int b = 0; b < 4; b++)
				h = (h ^ ((ranks[i] >> (8 * b)) & 0xff)) * 1099511628211ull;
		snprintf(sig, sizeof(sig), "%016llx", (unsigned long long)h);
	}
	for (unsigned k = 0; k < x->nnodes; k++)
		ninv += in[k];
	if (ninv == 1 && in[x->me]) { /* every participant is here */
		pmix_srv_fence_complete(f, true, data, dlen);
		goto out;
	}
	size_t s;
	for (s = 0; s < x->nseqs && strcmp(x->seqs[s].sig, sig); s++)
		;
	if (s == x->nseqs) {
		struct seqent *g = realloc(x->seqs, (x->nseqs + 1) * sizeof(*g));
		if (!g)
			goto fail;
		x->seqs = g;
		snprintf(g[s].sig, sizeof(g[s].sig), "%s", sig);
		g[s].n = 0;
		x->nseqs++;
	}
	o = op_new(x, x->timeout);
	if (!o) {
		xlog("cannot reach the store at %s:%u for a cross-node fence", x->host, x->port);
		goto fail;
	}
	snprintf(o->base, sizeof(o->base), "%sfence/%s.%lu/", x->prefix, sig, x->seqs[s].n++);
	if (getenv("DPTP_RUN_DEBUG"))
		fprintf(stderr, "dptp-run: node %u fence %s over %zu node(s), %zu bytes\n", x->me, o->base, ninv, dlen);
	o->inv = calloc(ninv, sizeof(*o->inv));
	if (!o->inv) {
		x->nops--;
		op_free(o);
		goto fail;
	}
	for (unsigned k = 0; k < x->nnodes; k++)
		if (in[k])
			o->inv[o->ninv++] = k;
	o->fence = f;
	o->st = X_ADD;
	snprintf(key, sizeof(key), "%sblob/%u", o->base, x->me);
	int rc = frame_set(o, key, data, dlen);
	snprintf(key, sizeof(key), "%scount", o->base);
	if (rc || put_u8(o, DPTP_TCPSTORE_ADD) || put_str(o, key, strlen(key)) || put_u64(o, 1)) {
		x->nops--;
		op_fail(o, "out of memory");
	}
	x->count++;
	goto out;
fail:
	pmix_srv_fence_complete(f, false, NULL, 0);
out:
	free(in);
	free(ranks);
}

static void hb_tick(struct xnode *x, double now);
static void store_tick(struct xnode *x, double now);

size_t xnode_pollfds(struct xnode *x, struct pollfd *pfd, size_t max)
{
	size_t n = 0;
	if (x) { /* before the poll: their frames go out now */
		hb_tick(x, dptp_now());
		store_tick(x, dptp_now());
	}
	for (size_t i = 0; x && i < x->nops && n < max; i++)
		pfd[n++] = (struct pollfd){.fd = x->ops[i]->fd,
			.events = POLLIN | (x->ops[i]->outoff < x->ops[i]->out.len ? POLLOUT : 0)};
	return n;
}

void xnode_dmodex_answer(struct xnode *x, void *token, bool found, const void *data, size_t len);

/* Whether o->in holds a whole MULTI_GET reply of n values: 1 (their
 * total length in *total), 0 (more bytes needed), -EPROTO. */
static int mget_reply(const struct xop *o, size_t n, size_t *total)
{
	size_t off = 0, sum = 0;
	for (size_t i = 0; i < n; i++) {
		if (o->inlen < off + 8)
			return 0;
		uint64_t l = dptp_le64_get(o->in + off);
		if (l > DPTP_TCPSTORE_MAX_VALUE)
			return -EPROTO;
		if (o->inlen < off + 8 + l)
			return 0;
		off += 8 + l;
		sum += l;
	}
	if (total)
		*total = sum;
	return 1;
}

/* ---- advance(), one function per state ----------------------------------------
 * Each consumes what its state needs from o->in and returns STEP_DONE (the op
 * is done: freed by the caller), STEP_MORE (more bytes needed), STEP_NEXT
 * (it moved to another state: go on) or <0 (a protocol error). */
enum { STEP_MORE = 0, STEP_DONE = 1, STEP_NEXT = 2 };

static void in_drop(struct xop *o, size_t n)
{
	o->inlen -= n;
	memmove(o->in, o->in + n, o->inlen);
}

/* X_WATCH: a node reported the attempt failed (which node: unknown here). */
static int failure_reported(struct xnode *x, struct xop *o)
{
	if (o->inlen < 1)
		return STEP_MORE;
	x->failed_node = (int)x->nnodes;
	return STEP_DONE;
}

/* X_QWAIT: a request is queued for this node: pop it. */
static int pop_request(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 1)
		return STEP_MORE;
	in_drop(o, 1);
	qkey(x, x->me, key, sizeof(key));
	if (put_u8(o, DPTP_TCPSTORE_QUEUE_POP) || put_str(o, key, strlen(key)))
		return -ENOMEM;
	o->st = X_QPOP;
	return STEP_NEXT;
}

/* The popped item after the reply's u64 flag: another node's PMIx event
 * ('E' and its bytes), delivered to the local workers, or a direct modex
 * request ("from id rank"), handed to the local server. 1 when taken, 0
 * when more bytes are needed, <0. */
static int take_request(struct xnode *x, struct xop *o)
{
	unsigned from, rank;
	unsigned long id;
	char req[64];
	if (o->inlen < 16)
		return 0;
	uint64_t l = dptp_le64_get(o->in + 8);
	if (l > DPTP_TCPSTORE_MAX_VALUE)
		return -EPROTO;
	if (o->inlen < 16 + l)
		return 0;
	if (l && o->in[16] == 'E') {
		if (pmix_srv_notify_local(x->srv, o->in + 17, l - 1) < 0)
			xlog("cannot deliver another node's PMIx event to the local workers");
		in_drop(o, 16 + l);
		return 1;
	}
	if (l >= sizeof(req))
		return -EPROTO;
	memcpy(req, o->in + 16, l);
	req[l] = '\0';
	in_drop(o, 16 + l);
	struct dmdx_token *t = malloc(sizeof(*t));
	if (sscanf(req, "%u %lu %u", &from, &id, &rank) != 3 || !t) {
		free(t);
		return -EPROTO;
	}
	t->from = from;
	t->id = id;
	if (pmix_srv_dmodex_local(x->srv, rank, t) < 0)
		xnode_dmodex_answer(x, t, false, NULL, 0);
	return 1;
}

/* X_QPOP: the QUEUE_POP reply (empty, or one item), then the next WAIT. */
static int serve_popped(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 8)
		return STEP_MORE;
	if (dptp_le64_get(o->in)) {
		int rc = take_request(x, o);
		if (rc <= 0)
			return rc;
	} else {
		in_drop(o, 8);
	}
	qkey(x, x->me, key, sizeof(key));
	if (frame_wait(o, key) < 0)
		return -ENOMEM;
	o->st = X_QWAIT;
	return STEP_NEXT;
}

/* X_RWAIT: the other node answered our direct modex request: read it. */
static int get_dmodex_reply(struct xnode *x, struct xop *o)
{
	if (o->inlen < 1)
		return STEP_MORE;
	in_drop(o, 1);
	if (put_u8(o, DPTP_TCPSTORE_GET) || put_str(o, o->base, strlen(o->base)))
		return -ENOMEM;
	o->st = X_RGET;
	return STEP_NEXT;
}

/* X_RGET: the answer (a found byte, then the data) to the local server. */
static int dmodex_replied(struct xnode *x, struct xop *o)
{
	if (o->inlen < 8)
		return STEP_MORE;
	uint64_t l = dptp_le64_get(o->in);
	if (l > DPTP_TCPSTORE_MAX_VALUE || l < 1)
		return -EPROTO;
	if (o->inlen < 8 + l)
		return STEP_MORE;
	pmix_srv_dmodex_complete(o->dmdx, o->in[8] == 0, o->in + 9, l - 1);
	o->dmdx = NULL;
	return STEP_DONE;
}

/* X_DADD: this node's workers are done; the last node to count says all
 * are, every node waits for it. */
static int workers_done_counted(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 8)
		return STEP_MORE;
	uint64_t v = dptp_le64_get(o->in);
	in_drop(o, 8);
	snprintf(key, sizeof(key), "%sworkers_done/all", x->prefix);
	if ((v == x->nnodes && frame_set(o, key, "1", 1) < 0) || frame_wait(o, key) < 0)
		return -ENOMEM;
	o->st = X_DWAIT;
	return STEP_NEXT;
}

/* X_DWAIT: every node's workers are done. */
static int workers_all_done(struct xnode *x, struct xop *o)
{
	if (o->inlen < 1)
		return STEP_MORE;
	x->finish = 2;
	return STEP_DONE;
}

/* The workers' pids of every node: each node APPENDs "<node> <pid>...\n" to
 * <prefix>pids and ADDs 1 to <prefix>pids_n, the node that brings it to
 * the node count sets <prefix>pids_done, and every node WAITs for that and
 * reads the one value: O(1) keys per node (each reading every node's key
 * was O(N) keys per node, N^2 on the store's host). */

/* X_PADD: the count after ours; the last node says done; all wait for it. */
static int pids_counted(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 8)
		return STEP_MORE;
	uint64_t n = dptp_le64_get(o->in);
	in_drop(o, 8);
	snprintf(key, sizeof(key), "%spids_done", x->prefix);
	if (n == x->nnodes && frame_set(o, key, "1", 1) < 0)
		return -ENOMEM;
	if (frame_wait(o, key) < 0)
		return -ENOMEM;
	o->st = X_PWAIT;
	return STEP_NEXT;
}

/* X_PWAIT: every node published its workers' pids: read them. */
static int get_pids(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 1)
		return STEP_MORE;
	in_drop(o, 1);
	snprintf(key, sizeof(key), "%spids", x->prefix);
	if (put_u8(o, DPTP_TCPSTORE_GET) || put_str(o, key, strlen(key)))
		return -ENOMEM;
	o->st = X_PGET;
	return STEP_NEXT;
}

/* X_PGET: the other nodes' worker pids, to the local server. */
static int pids_read(struct xnode *x, struct xop *o)
{
	int got = mget_reply(o, 1, NULL);
	if (got <= 0)
		return got;
	uint64_t l = dptp_le64_get(o->in);
	char *v = strndup((const char *)o->in + 8, l), *line = v;
	while (line && *line) {
		char *nl = strchr(line, '\n'), *p, *end;
		if (nl)
			*nl = 0;
		unsigned long k = strtoul(line, &p, 10);
		for (unsigned i = 0; p != line && k < x->nnodes && k != x->me && i < x->nodes[k].nproc; i++, p = end) {
			long pid = strtol(p, &end, 10);
			if (end == p || pid <= 0 || pid > INT32_MAX)
				break;
			pmix_srv_remote_pid(x->srv, x->nodes[k].base + i, (pid_t)pid);
		}
		line = nl ? nl + 1 : NULL;
	}
	free(v);
	return STEP_DONE;
}

static void set_lost(struct xnode *x, unsigned node, const char *why)
{
	if (x->lost >= 0)
		return;
	x->lost = (int)node;
	snprintf(x->lost_why, sizeof(x->lost_why), "%s", why);
}

/* X_HB: a heartbeat round's counters; a node whose counter moved is alive,
 * one whose counter stood still over rounds sent hb_timeout apart is lost.
 * Judged on the rounds' send times, once their replies are read: a
 * launcher that was not scheduled for a while (a loaded host) reads the
 * replies that waited for it before it judges anyone. */
static int heartbeats_read(struct xnode *x, struct xop *o)
{
	if (!x->hb_waiting || o->inlen < 8 * (size_t)(1 + x->hb_nwatch))
		return STEP_MORE;
	for (unsigned i = 0; i < x->hb_nwatch; i++) { /* after our own counter */
		unsigned k = x->hb_watch[i];
		uint64_t v = dptp_le64_get(o->in + 8 * (1 + i));
		if (v != x->hb_val[k]) {
			x->hb_val[k] = v;
			x->hb_seen[k] = x->hb_sent;
		} else if (x->hb_sent - x->hb_seen[k] > x->hb_timeout + (v ? 0 : 0.05 * x->nnodes) && x->finish != 2) {
			/* (a node that never beat yet may still be starting: the
			 * slowest of N nodes learns its ranks last; 0.05 s a node
			 * more for its first beat) */
			char why[160];
			snprintf(why, sizeof(why), "no heartbeat for %.0f s", x->hb_sent - x->hb_seen[k]);
			set_lost(x, k, why);
		}
	}
	in_drop(o, 8 * (size_t)(1 + x->hb_nwatch));
	x->hb_waiting = false;
	return STEP_NEXT;
}

/* X_ADD: this node's blob is in and counted; the last node says done,
 * every node waits for it. */
static int fence_counted(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 8)
		return STEP_MORE;
	uint64_t v = dptp_le64_get(o->in);
	in_drop(o, 8);
	if (v == o->ninv) {
		snprintf(key, sizeof(key), "%sdone", o->base);
		if (frame_set(o, key, "1", 1) < 0)
			return -ENOMEM;
	}
	snprintf(key, sizeof(key), "%sdone", o->base);
	if (frame_wait(o, key) < 0)
		return -ENOMEM;
	o->st = X_WAIT;
	return STEP_NEXT;
}

/* X_WAIT: every node's blob is in: read them all. */
static int fence_all_in(struct xnode *x, struct xop *o)
{
	char key[256];
	if (o->inlen < 1)
		return STEP_MORE;
	if (o->in[0] != DPTP_TCPSTORE_STOP_WAITING)
		return -EPROTO;
	in_drop(o, 1);
	if (getenv("DPTP_RUN_DEBUG"))
		fprintf(stderr, "dptp-run: node %u %sdone\n", x->me, o->base);
	if (put_u8(o, DPTP_TCPSTORE_MULTI_GET) || put_u64(o, o->ninv))
		return -ENOMEM;
	for (size_t i = 0; i < o->ninv; i++) {
		snprintf(key, sizeof(key), "%sblob/%u", o->base, o->inv[i]);
		if (put_str(o, key, strlen(key)) < 0)
			return -ENOMEM;
	}
	o->st = X_MGET;
	return STEP_NEXT;
}

/* X_MGET: the blobs, concatenated in node order, complete the fence. */
static int fence_blobs_read(struct xnode *x, struct xop *o)
{
	size_t off = 0, total = 0;
	int got = mget_reply(o, o->ninv, &total);
	if (got <= 0)
		return got;
	/* concatenate in place */
	uint8_t *cat = malloc(total ? total : 1);
	if (!cat)
		return -ENOMEM;
	off = 0;
	size_t w = 0;
	for (size_t i = 0; i < o->ninv; i++) {
		uint64_t l = dptp_le64_get(o->in + off);
		memcpy(cat + w, o->in + off + 8, l);
		w += l;
		off += 8 + l;
	}
	if (getenv("DPTP_RUN_DEBUG"))
		fprintf(stderr, "dptp-run: node %u %scomplete, %zu bytes\n", x->me, o->base, total);
	pmix_srv_fence_complete(o->fence, true, cat, total);
	o->fence = NULL;
	free(cat);
	return STEP_DONE;
}

/* X_PROBE: nothing after the PING echo (store_answered). */
static int probed(struct xnode *x, struct xop *o)
{
	(void)x;
	(void)o;
	return STEP_DONE;
}

static int (*const steps[])(struct xnode *x, struct xop *o) = {
	[X_ADD] = fence_counted,
	[X_WAIT] = fence_all_in,
	[X_MGET] = fence_blobs_read,
	[X_WATCH] = failure_reported,
	[X_QWAIT] = pop_request,
	[X_QPOP] = serve_popped,
	[X_RWAIT] = get_dmodex_reply,
	[X_RGET] = dmodex_replied,
	[X_DADD] = workers_done_counted,
	[X_DWAIT] = workers_all_done,
	[X_HB] = heartbeats_read,
	[X_PADD] = pids_counted,
	[X_PWAIT] = get_pids,
	[X_PGET] = pids_read,
	[X_PROBE] = probed,
};
_Static_assert(sizeof(steps) / sizeof(steps[0]) == X_PROBE + 1, "a step for every state");

static void store_answered(struct xnode *x, struct xop *o);

/* Consumes what the state needs from o->in. 1: the op is done (freed by the
 * caller), 0: more bytes needed, <0: protocol error. */
static int advance(struct xnode *x, struct xop *o)
{
	for (;;) {
		if (o->echo) { /* the PING echo comes first */
			if (o->inlen < 4)
				return 0;
			in_drop(o, 4);
			o->echo = false;
			if (o->probe)
				store_answered(x, o);
		}
		int rc = steps[o->st](x, o);
		if (rc != STEP_NEXT)
			return rc;
	}
}


/* Sends the heartbeat round when due; judges the other nodes' silence. */
static void hb_tick(struct xnode *x, double now)
{
	char key[192];
	if (!x->hb || x->finish == 2 || x->lost >= 0)
		return;
	if (x->hb_waiting || now < x->hb_next)
		return;
	for (unsigned i = 0; i <= x->hb_nwatch; i++) {
		unsigned k = i ? x->hb_watch[i - 1] : x->me;
		snprintf(key, sizeof(key), "%shb/%u", x->prefix, k);
		if (put_u8(x->hb, DPTP_TCPSTORE_ADD) || put_str(x->hb, key, strlen(key)) || put_u64(x->hb, i == 0))
			return;
	}
	x->hb_waiting = true;
	x->hb_sent = now;
	x->hb_next = now + x->hb_interval;
}

/* ---- the store's liveness (see struct xnode) ---- */

/* why, for "... since 3 s": "connect: Connection refused" reads
 * "connection refused". */
static void set_why(char *dst, size_t len, const char *why)
{
	if (!strncmp(why, "connect: ", 9))
		why += 9;
	snprintf(dst, len, "%s", why);
	if (dst[0] >= 'A' && dst[0] <= 'Z' && dst[1] >= 'a' && dst[1] <= 'z')
		dst[0] = (char)(dst[0] - 'A' + 'a');
}

/* true: the doubt starts now */
static bool store_doubt(struct xnode *x, const char *why, double since)
{
	if (x->store_since > 0 || x->finish == 2 || x->gone_why[0])
		return false;
	x->store_since = since;
	x->doubt_quiet = false;
	x->probe_next = dptp_now(); /* a fresh connection at once */
	set_why(x->store_why, sizeof(x->store_why), why);
	return true;
}

static void probe_broke(struct xnode *x, const char *why)
{
	x->probe_failed = true;
	set_why(x->store_why, sizeof(x->store_why), why);
}

/* A probe's PING echo, or any reply (o NULL): the store answers. What
 * broke opens again. */
static void store_answered(struct xnode *x, struct xop *o)
{
	double now = dptp_now();
	if (o) {
		o->probe = false;
		if (o == x->probe)
			x->probe = NULL;
	}
	/* once: a broken rendezvous link doubts it on every tick; and not for
	 * a late heartbeat reply, which a loaded store's host sends often */
	if (x->store_since > 0 && !x->told_back && !x->doubt_quiet) {
		xlog_at('W', "the store at %s:%u answers again %.0f s after %s", x->host, x->port, now - x->store_since,
			x->store_why);
		x->told_back = true;
	}
	x->store_since = 0;
	x->probe_failed = false;
	if (!x->watch && !(x->watch = open_watch(x)))
		store_doubt(x, x->dial_why, now);
	if (!x->serve && !(x->serve = open_serve(x)))
		store_doubt(x, x->dial_why, now);
	if (x->beats && !x->hb && !(x->hb = open_hb(x, now)))
		store_doubt(x, x->dial_why, now);
}

/* In doubt: a probe every probe_iv s (the failure watch itself, if it was
 * lost), and the verdict. A heartbeat round still unanswered is a probe
 * already (static): no connection more to a store that is slow. */
static void store_tick(struct xnode *x, double now)
{
	bool hb_out = x->hb && x->hb_waiting;
	if (x->store_since <= 0 || x->gone_why[0] || x->finish == 2 || x->probe_iv <= 0)
		return;
	if (!x->probe && !hb_out && now >= x->probe_next) {
		struct xop *o = x->watch ? op_new(x, 0) : (x->watch = open_watch(x));
		x->probe_next = now + x->probe_iv;
		x->probe_sent = now;
		if (o) {
			if (o != x->watch)
				o->st = X_PROBE;
			o->probe = true;
			x->probe = o;
		} else {
			probe_broke(x, x->dial_why);
		}
	}
	double doubt = now - x->store_since;
	if (x->probe_failed && doubt >= x->gone_after)
		snprintf(x->gone_why, sizeof(x->gone_why), "%s since %.0f s", x->store_why, doubt);
	else if (((x->probe && now - x->probe_sent >= x->gone_after) || (hb_out && now - x->hb_sent >= x->gone_after)) &&
		 doubt >= x->silent_after)
		snprintf(x->gone_why, sizeof(x->gone_why), "no answer since %.0f s, after %s", doubt, x->store_why);
}

void xnode_store_bounds(struct xnode *x, double probe_iv, double gone_after, double silent_after)
{
	if (!x)
		return;
	x->probe_iv = probe_iv;
	x->gone_after = gone_after;
	x->silent_after = silent_after > gone_after ? silent_after : gone_after;
}

void xnode_store_doubt(struct xnode *x, const char *why, double since)
{
	if (x)
		store_doubt(x, why, since);
}

const char *xnode_store_gone(const struct xnode *x)
{
	return x && x->gone_why[0] ? x->gone_why : NULL;
}

int xnode_lost(const struct xnode *x, const char **why)
{
	if (!x || x->lost < 0)
		return -1;
	if (why)
		*why = x->lost_why;
	return x->lost;
}

double xnode_poll_timeout(const struct xnode *x, double timeout)
{
	double now = dptp_now();
	if (x && x->hb && !x->hb_waiting) {
		double left = x->hb_next - now;
		if (left < timeout)
			timeout = left > 0 ? left : 0;
	}
	if (x && x->store_since > 0 && !x->gone_why[0]) { /* the next probe or verdict (store_tick) */
		bool hb_out = x->hb && x->hb_waiting, probing = !x->probe && !hb_out;
		double at[4] = {probing ? x->probe_next : 0, x->store_since + x->gone_after,
			x->store_since + x->silent_after,
			x->probe ? x->probe_sent + x->gone_after : hb_out ? x->hb_sent + x->gone_after : 0};
		for (int k = 0; k < 4; k++)
			if (at[k] > now && at[k] - now < timeout)
				timeout = at[k] - now;
		if (probing && x->probe_next <= now)
			timeout = 0;
	}
	return timeout;
}

int xnode_handle(struct xnode *x, const struct pollfd *pfd, size_t n)
{
	double now = dptp_now();
	if (!x)
		return -1;
	/* pfd[i] belongs to ops[i] as xnode_pollfds laid them out */
	for (size_t i = n; i-- > 0;) {
		struct xop *o = x->ops[i];
		const char *why = NULL;
		int rc = 0;
		bool conn = false; /* the connection broke */
		if (pfd[i].fd != o->fd)
			continue;
		if (pfd[i].revents & POLLOUT) {
			ssize_t w = send(o->fd, o->out.buf + o->outoff, o->out.len - o->outoff, MSG_NOSIGNAL);
			if (w > 0) {
				o->outoff += (size_t)w;
				if (o->outoff == o->out.len)
					o->outoff = o->out.len = 0;
			} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
				why = strerror(errno);
				conn = true;
			}
		}
		if (!why && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
			if (o->inlen + 65536 > o->incap) {
				size_t cap = (o->inlen + 65536) * 2;
				uint8_t *g = realloc(o->in, cap);
				if (!g)
					why = "out of memory";
				else {
					o->in = g;
					o->incap = cap;
				}
			}
			if (!why) {
				ssize_t r = recv(o->fd, o->in + o->inlen, o->incap - o->inlen, 0);
				if (r > 0) {
					o->inlen += (size_t)r;
					if (x->store_since > 0) /* however late: it answers */
						store_answered(x, NULL);
				} else if (r == 0)
					why = "the store closed the connection";
				else if (errno != EAGAIN && errno != EINTR)
					why = strerror(errno);
				conn = why != NULL;
			}
			if (!why && (rc = advance(x, o)) < 0)
				why = rc == -ENOMEM ? "out of memory" : "unexpected reply from the store";
		}
		if (!why && rc == 0 && o->deadline > 0 && now >= o->deadline)
			why = "timed out";
		/* the store's own connections: a broken one puts the store in
		 * doubt (a probe tells, see struct xnode) */
		if (why && o == x->probe) {
			x->probe = NULL;
			probe_broke(x, why);
		}
		if (why && (o == x->serve || o == x->hb || o == x->watch)) {
			if (!conn)
				xlog("lost the %s on the store: %s", o == x->serve ? "direct-modex queue" : o == x->hb ?
					"heartbeats" : "failure watch", why);
			if (o == x->serve)
				x->serve = NULL;
			else if (o == x->hb)
				x->hb = NULL;
			else
				x->watch = NULL;
			store_doubt(x, why, now);
		}
		if (why || rc == 1) {
			if (o == x->watch) /* done: a failure was reported */
				x->watch = NULL;
			if (o == x->probe)
				x->probe = NULL;
			memmove(&x->ops[i], &x->ops[i + 1], (x->nops - i - 1) * sizeof(x->ops[0]));
			x->nops--;
			if (o->st == X_DADD || o->st == X_DWAIT)
				x->finish = 2;
			if (why)
				op_fail(o, why);
			else
				op_free(o);
		}
	}
	/* deadlines of ops that saw no event */
	for (size_t i = x->nops; i-- > 0;) {
		struct xop *o = x->ops[i];
		if (o->deadline > 0 && now >= o->deadline) {
			memmove(&x->ops[i], &x->ops[i + 1], (x->nops - i - 1) * sizeof(x->ops[0]));
			x->nops--;
			if (o->st == X_DADD || o->st == X_DWAIT)
				x->finish = 2;
			op_fail(o, "timed out");
		}
	}
	/* after the replies that came: the store's silence puts it in doubt
	 * from the round's send on (a loaded store's host answers late) */
	if (x->hb && x->hb_waiting && x->finish != 2 && x->lost < 0 && now - x->hb_sent > x->hb_timeout &&
	    store_doubt(x, "a heartbeat unanswered", x->hb_sent))
		x->doubt_quiet = true;
	store_tick(x, now);
	int f = x->failed_node;
	x->failed_node = -1;
	return f;
}

void xnode_dmodex(struct xnode *x, struct pmix_srv_dmodex *d)
{
	unsigned rank = pmix_srv_dmodex_rank(d);
	int node = node_of(x, rank);
	char key[192], req[64];
	struct xop *o;
	if (node < 0 || (unsigned)node == x->me) {
		pmix_srv_dmodex_complete(d, false, NULL, 0);
		return;
	}
	o = op_new(x, x->timeout);
	if (!o) {
		xlog("cannot reach the store at %s:%u for a direct modex", x->host, x->port);
		pmix_srv_dmodex_complete(d, false, NULL, 0);
		return;
	}
	unsigned long id = x->dmdx_id++;
	snprintf(o->base, sizeof(o->base), "%sdmodex/%u/answer/%lu", x->prefix, x->me, id);
	snprintf(req, sizeof(req), "%u %lu %u", x->me, id, rank);
	qkey(x, (unsigned)node, key, sizeof(key));
	o->dmdx = d;
	o->st = X_RWAIT;
	if (put_u8(o, DPTP_TCPSTORE_QUEUE_PUSH) || put_str(o, key, strlen(key)) || put_str(o, req, strlen(req)) ||
	    frame_wait(o, o->base) < 0) {
		x->nops--;
		op_fail(o, "out of memory");
	}
}

void xnode_notify(struct xnode *x, const void *blob, size_t len)
{
	char key[192];
	uint8_t *v;
	if (!x || !x->serve || len + 1 > DPTP_TCPSTORE_MAX_VALUE || !(v = malloc(len + 1)))
		return;
	v[0] = 'E';
	memcpy(v + 1, blob, len);
	for (unsigned k = 0; k < x->nnodes; k++) {
		if (k == x->me)
			continue;
		qkey(x, k, key, sizeof(key));
		/* QUEUE_PUSH has no reply: it can follow the pending WAIT */
		if (put_u8(x->serve, DPTP_TCPSTORE_QUEUE_PUSH) || put_str(x->serve, key, strlen(key)) ||
		    put_str(x->serve, v, len + 1))
			xlog("cannot forward a PMIx event to node %u", k);
	}
	free(v);
}

void xnode_dmodex_answer(struct xnode *x, void *token, bool found, const void *data, size_t len)
{
	struct dmdx_token *t = token;
	char key[192];
	uint8_t *v;
	if (!x || !x->serve) {
		free(t);
		return;
	}
	v = malloc(len + 1);
	if (v) {
		v[0] = found ? 0 : 1;
		if (len)
			memcpy(v + 1, data, len);
		snprintf(key, sizeof(key), "%sdmodex/%u/answer/%lu", x->prefix, t->from, t->id);
		/* SET has no reply: it can follow the pending WAIT on the queue */
		if (frame_set(x->serve, key, v, found ? len + 1 : 1) < 0)
			xlog("out of memory answering a direct modex");
	}
	free(v);
	free(t);
}

void xnode_publish_pids(struct xnode *x, const pid_t *pids, unsigned n)
{
	char key[192], *v = malloc((size_t)n * 12 + 24);
	struct xop *o;
	size_t off = 0;
	if (!x || !x->serve || !v) {
		free(v);
		return;
	}
	off = (size_t)snprintf(v, 24, "%u", x->me);
	for (unsigned i = 0; i < n; i++)
		off += (size_t)snprintf(v + off, (size_t)n * 12 + 24 - off, " %d", (int)pids[i]);
	v[off++] = '\n';
	o = op_new(x, 0);
	if (!o) {
		free(v);
		return;
	}
	snprintf(key, sizeof(key), "%spids", x->prefix);
	int rc = put_u8(o, DPTP_TCPSTORE_APPEND) || put_str(o, key, strlen(key)) || put_str(o, v, off);
	snprintf(key, sizeof(key), "%spids_n", x->prefix);
	rc = rc || put_u8(o, DPTP_TCPSTORE_ADD) || put_str(o, key, strlen(key)) || put_u64(o, 1);
	free(v);
	if (rc) {
		x->nops--;
		op_free(o);
		return;
	}
	o->st = X_PADD;
}

void xnode_finish(struct xnode *x, double timeout)
{
	char key[192];
	struct xop *o;
	if (!x || x->finish)
		return;
	x->finish = 1;
	/* this node's workers are done: they need no other node's pids. A pids
	 * exchange whose requests are all sent (the count, and pids_done where
	 * it was the last) waits only to read them: its connection goes, so
	 * that a node holds one connection for these exchanges, not two */
	for (size_t i = x->nops; i-- > 0;) {
		o = x->ops[i];
		if (o->st == X_PWAIT && o->outoff == o->out.len) {
			memmove(&x->ops[i], &x->ops[i + 1], (x->nops - i - 1) * sizeof(x->ops[0]));
			x->nops--;
			op_free(o);
		}
	}
	o = op_new(x, timeout);
	snprintf(key, sizeof(key), "%sworkers_done/count", x->prefix);
	if (!o || put_u8(o, DPTP_TCPSTORE_ADD) || put_str(o, key, strlen(key)) || put_u64(o, 1)) {
		xlog("cannot tell the store that this node's workers are done");
		if (o) {
			x->nops--;
			op_free(o);
		}
		x->finish = 2;
		return;
	}
	o->st = X_DADD;
}

bool xnode_finished(const struct xnode *x)
{
	return !x || x->finish == 2;
}
