/* The c10d rendezvous of torch 2.11 (dynamic_rendezvous.py,
 * c10d_rendezvous_backend.py), on the wire as torch's agents do it, so that
 * dptp-run and torchrun agents can share one job (see rendezvous.h).
 *
 * The store: a TCPStore at --rdzv-endpoint (port 29400 by default), hosted
 * by the agent whose machine the endpoint names (or is_host=1), the others
 * connect. The state: the pickled _RendezvousState (rdzv_state.c), base64,
 * under "/torch.rendezvous.<run_id>", initialised to the null sentinel and
 * written only with COMPARE_SET against the value last read (torch's fencing
 * token); a write that loses the race just reads the winner's state.
 *
 * The operations are torch's state machines, action for action: exit (leave
 * the participants of the last round), join (participants, last call, wait
 * list for a running round, redundancy list when full, complete with ranks
 * in _NodeDesc order), keep-alive (heartbeats every keep_alive_interval;
 * nodes silent for keep_alive_interval * keep_alive_max_attempt are dropped
 * by whoever syncs next) and close. A completed round's keys live under
 * "/torch.rendezvous.<run_id>.<round>/": MASTER_ADDR / MASTER_PORT of the
 * workers' store (rank 0 hosts it, like torch's shared store), then the
 * agents' role_info / assigned_ranks and exit barrier, as static. */
#include "rdzv/rdzv_c10d.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log/glog.h"
#include "base/host.h"
#include "rdzv/rdzv_state.h"
#include "wire/tcpstore.h"

#define C10D_DEFAULT_PORT 29400

struct rdzv_c10d {
	struct rdzv_state *st;
	char *token;       /* the base64 value last read; NULL before any */
	bool dirty;
	double last_sync;  /* dptp_now() of the last sync, < 0 never */
	struct rdzv_nd me;
	char key[200];     /* "torch.rendezvous.<run_id>" (under "/") */
	struct dptp_tcpstore_client *c; /* the state key */
	struct dptp_tcpstore_server *wserver; /* the workers' store, as rank 0 */
	unsigned wport;
	bool heartbeats;   /* on between a completed join and the next one */
	bool joined_once;
	char host[256];    /* the endpoint: the store of dptp-run's own keys too */
	unsigned port;
};

enum action { A_KEEP_ALIVE, A_ADD_PART, A_ADD_WAIT, A_ADD_REDUND, A_REM_PART, A_REM_WAIT, A_REM_REDUND,
	A_COMPLETE, A_CLOSE, A_SYNC, A_ERR_CLOSED, A_ERR_TIMEOUT, A_GRACEFUL_EXIT, A_FINISH };

/* torch's INFO lines (LOGLEVEL=INFO), glog-prefixed as the launcher's. */
__attribute__((format(printf, 2, 3)))
static void info(const struct rendezvous *r, const char *fmt, ...)
{
	va_list ap;
	if (!r->info_log)
		return;
	va_start(ap, fmt);
	glog_vlog('I', fmt, ap);
	va_end(ap);
}

/* ---- the state holder (torch's _BackendRendezvousStateHolder) ----------- */

static void nd_del(struct rdzv_nd *list, long long *vals, unsigned *n, int i)
{
	memmove(&list[i], &list[i + 1], (*n - (unsigned)i - 1) * sizeof(*list));
	if (vals)
		memmove(&vals[i], &vals[i + 1], (*n - (unsigned)i - 1) * sizeof(*vals));
	(*n)--;
}

/* dict[key] = v: in place when present, appended when not. */
static int nd_put(struct rdzv_nd *list, long long *vals, unsigned *n, const struct rdzv_nd *nd, long long v)
{
	int i = rdzv_state_nd_find(list, *n, nd);
	if (i < 0) {
		if (*n == RDZV_MAX_NODES)
			return -E2BIG;
		i = (int)(*n)++;
		list[i] = *nd;
	}
	if (vals)
		vals[i] = v;
	return 0;
}

static void nd_remove(struct rdzv_nd *list, long long *vals, unsigned *n, const struct rdzv_nd *nd)
{
	int i = rdzv_state_nd_find(list, *n, nd);
	if (i >= 0)
		nd_del(list, vals, n, i);
}

static void participant_epilogue(struct rdzv_state *s, unsigned min_nodes)
{
	if (s->complete) {
		if (s->npart == 0) { /* nobody left: the next round */
			s->complete = false;
			s->round++;
		}
	} else if (s->npart < min_nodes) {
		s->has_deadline = false;
	}
}

/* Drops the nodes whose last heartbeat is too old (torch's _sanitize). */
static void sanitize(struct rendezvous *r)
{
	struct rdzv_state *s = r->c10d->st;
	const struct run_opts *o = r->opts;
	long long expire = rdzv_state_now_us() - (long long)o->c10d.keep_alive_interval * o->c10d.keep_alive_max_attempt * 1000000;
	bool removed = false;
	for (unsigned i = 0; i < s->nheart;) {
		if (s->heart_us[i] >= expire) {
			i++;
			continue;
		}
		struct rdzv_nd dead = s->heart[i];
		nd_del(s->heart, s->heart_us, &s->nheart, (int)i);
		int p = rdzv_state_nd_find(s->part, s->npart, &dead);
		if (p >= 0) {
			nd_del(s->part, s->rank, &s->npart, p);
			removed = true;
		}
		nd_remove(s->wait, NULL, &s->nwait, &dead);
		nd_remove(s->redund, NULL, &s->nredund, &dead);
	}
	if (removed)
		participant_epilogue(s, o->min_nodes);
}

/* Reads the state, or writes ours when dirty (COMPARE_SET against the token).
 * *has_set: 1 written, 0 someone else's state won, -1 no write attempted. */
static int sync_state(struct rendezvous *r, int *has_set, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	struct dptp_tcpstore_buf cur = {0};
	uint8_t *pk = NULL, *raw = NULL;
	char *b64 = NULL;
	size_t pkn = 0, rawn = 0;
	int rc;
	*has_set = -1;
	if (c->dirty) {
		if ((rc = rdzv_state_encode(c->st, &pk, &pkn, err)) < 0)
			return rc;
		b64 = rdzv_state_b64_encode(pk, pkn);
		free(pk);
		if (!b64)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		const char *exp = c->token ? c->token : RDZV_NULL_SENTINEL;
		rc = dptp_tcpstore_client_compare_set(c->c, c->key, exp, strlen(exp), b64, strlen(b64), &cur, err);
		if (rc == 0)
			*has_set = cur.len == strlen(b64) && !memcmp(cur.data, b64, cur.len);
		free(b64);
	} else {
		if (c->last_sync >= 0 && dptp_now() - c->last_sync < 1.0)
			return 0; /* torch serves a state younger than 1 s from its cache */
		rc = dptp_tcpstore_client_get(c->c, c->key, &cur, err);
	}
	if (rc < 0)
		return rc;
	if (cur.len == strlen(RDZV_NULL_SENTINEL) && !memcmp(cur.data, RDZV_NULL_SENTINEL, cur.len)) {
		rdzv_state_init(c->st);
	} else {
		if (rdzv_state_b64_decode((const char *)cur.data, cur.len, &raw, &rawn) < 0) {
			free(cur.data);
			return dptp_err_set(err, -EPROTO, "the rendezvous state under '/%s' is not base64", c->key);
		}
		rc = rdzv_state_decode(raw, rawn, c->st, err);
		free(raw);
		if (rc < 0) {
			free(cur.data);
			dptp_err_prefix(err, "key '/%s'", c->key);
			return rc;
		}
	}
	free(c->token);
	c->token = (char *)cur.data; /* NUL-terminated by the client */
	c->dirty = false;
	c->last_sync = dptp_now();
	sanitize(r);
	return 0;
}

/* ---- the operations (torch's _Rendezvous*Op and executor) --------------- */

static bool should_keep_alive(const struct rendezvous *r)
{
	const struct rdzv_c10d *c = r->c10d;
	int i = rdzv_state_nd_find(c->st->heart, c->st->nheart, &c->me);
	return i >= 0 && c->st->heart_us[i] <= rdzv_state_now_us() - (long long)r->opts->c10d.keep_alive_interval * 1000000;
}

static enum action op_keep_alive(struct rendezvous *r, double deadline)
{
	if (should_keep_alive(r))
		return dptp_now() > deadline ? A_ERR_TIMEOUT : A_KEEP_ALIVE;
	return A_FINISH;
}

static enum action op_exit(struct rendezvous *r, double deadline)
{
	if (rdzv_state_nd_find(r->c10d->st->part, r->c10d->st->npart, &r->c10d->me) >= 0)
		return dptp_now() > deadline ? A_ERR_TIMEOUT : A_REM_PART;
	return A_FINISH;
}

static enum action op_close(struct rendezvous *r, double deadline)
{
	if (r->c10d->st->closed)
		return A_FINISH;
	return dptp_now() > deadline ? A_ERR_TIMEOUT : A_CLOSE;
}

static enum action op_join(struct rendezvous *r, double deadline)
{
	const struct rdzv_state *s = r->c10d->st;
	const struct rdzv_nd *me = &r->c10d->me;
	const struct run_opts *o = r->opts;
	bool redundant = rdzv_state_nd_find(s->redund, s->nredund, me) >= 0;
	bool waiting = rdzv_state_nd_find(s->wait, s->nwait, me) >= 0;
	bool part = rdzv_state_nd_find(s->part, s->npart, me) >= 0;
	if (s->closed)
		return redundant ? A_GRACEFUL_EXIT : A_ERR_CLOSED;
	if (redundant) {
		if (s->npart == o->max_nodes)
			return should_keep_alive(r) ? A_KEEP_ALIVE : A_SYNC;
		return A_REM_REDUND;
	}
	if (s->complete && part)
		return A_FINISH;
	double now = dptp_now();
	if (now > deadline) {
		if (now <= deadline + 5.0) { /* torch's rollback period */
			if (part)
				return A_REM_PART;
			if (waiting)
				return A_REM_WAIT;
		}
		return A_ERR_TIMEOUT;
	}
	if (s->complete) {
		if (s->npart < o->max_nodes) {
			if (!waiting)
				return A_ADD_WAIT;
		} else if (!waiting) {
			return A_ADD_REDUND;
		}
	} else if (part) {
		if (s->npart >= o->min_nodes && s->npart <= o->max_nodes && s->has_deadline &&
		    s->deadline_us < rdzv_state_now_us())
			return A_COMPLETE;
	} else {
		return A_ADD_PART;
	}
	return should_keep_alive(r) ? A_KEEP_ALIVE : A_SYNC;
}

static void mark_complete(struct rdzv_state *s)
{
	s->complete = true;
	s->has_deadline = false;
	for (unsigned k = 0; k < s->npart; k++) { /* rank = place in sorted order */
		long long rank = 0;
		for (unsigned i = 0; i < s->npart; i++)
			rank += rdzv_state_nd_cmp(&s->part[i], &s->part[k]) < 0;
		s->rank[k] = rank;
	}
}

static int apply(struct rendezvous *r, enum action a, double *deadline)
{
	struct rdzv_state *s = r->c10d->st;
	const struct rdzv_nd *me = &r->c10d->me;
	const struct run_opts *o = r->opts;
	long long now = rdzv_state_now_us();
	switch (a) {
	case A_KEEP_ALIVE:
		return nd_put(s->heart, s->heart_us, &s->nheart, me, now);
	case A_ADD_PART:
		nd_remove(s->wait, NULL, &s->nwait, me);
		DPTP_TRY(nd_put(s->part, s->rank, &s->npart, me, 0));
		DPTP_TRY(nd_put(s->heart, s->heart_us, &s->nheart, me, now));
		if (s->npart == o->min_nodes) {
			s->has_deadline = true;
			s->deadline_us = rdzv_state_now_us() + (long long)o->c10d.last_call * 1000000;
		}
		if (s->npart == o->max_nodes)
			mark_complete(s);
		return 0;
	case A_ADD_WAIT:
		nd_remove(s->redund, NULL, &s->nredund, me);
		DPTP_TRY(nd_put(s->wait, NULL, &s->nwait, me, 0));
		return nd_put(s->heart, s->heart_us, &s->nheart, me, now);
	case A_ADD_REDUND:
		DPTP_TRY(nd_put(s->redund, NULL, &s->nredund, me, 0));
		return nd_put(s->heart, s->heart_us, &s->nheart, me, now);
	case A_REM_PART:
		nd_remove(s->part, s->rank, &s->npart, me);
		nd_remove(s->heart, s->heart_us, &s->nheart, me);
		participant_epilogue(s, o->min_nodes);
		return 0;
	case A_REM_WAIT:
		nd_remove(s->wait, NULL, &s->nwait, me);
		nd_remove(s->heart, s->heart_us, &s->nheart, me);
		return 0;
	case A_REM_REDUND:
		nd_remove(s->redund, NULL, &s->nredund, me);
		nd_remove(s->heart, s->heart_us, &s->nheart, me);
		*deadline = dptp_now() + o->c10d.join; /* it may take part now */
		return 0;
	case A_COMPLETE:
		mark_complete(s);
		return 0;
	case A_CLOSE:
		s->closed = true;
		return 0;
	default:
		return 0;
	}
}

/* Waits s seconds; -EINTR when a death signal is pending. */
static int pause_s(struct rendezvous *r, double s)
{
	struct pollfd pfd = {.fd = r->abort_fd, .events = POLLIN};
	int n = poll(&pfd, r->abort_fd >= 0 ? 1 : 0, (int)(s * 1000));
	return n > 0 ? -EINTR : 0;
}

static int run_op(struct rendezvous *r, enum action (*op)(struct rendezvous *, double), double deadline,
	const char *what, struct dptp_err *err)
{
	for (;;) {
		int has_set;
		DPTP_TRY(sync_state(r, &has_set, err));
		enum action a = op(r, deadline);
		switch (a) {
		case A_FINISH:
			return 0;
		case A_ERR_CLOSED:
			return dptp_err_set(err, -ESHUTDOWN, "RendezvousClosedError: the rendezvous '%s' is closed", r->run_id);
		case A_GRACEFUL_EXIT:
			return dptp_err_set(err, -ECANCELED, "the rendezvous '%s' is closed and this node was redundant", r->run_id);
		case A_ERR_TIMEOUT:
			return dptp_err_set(err, -ETIMEDOUT, "RendezvousTimeoutError: %s of the rendezvous '%s' timed out", what,
				r->run_id);
		case A_SYNC:
			if (pause_s(r, 1.0) < 0)
				return dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
			break;
		default:
			if (apply(r, a, &deadline) < 0)
				return dptp_err_set(err, -E2BIG, "the rendezvous has more than %d nodes", RDZV_MAX_NODES);
			r->c10d->dirty = true;
		}
	}
}

/* ---- setup --------------------------------------------------------------- */

/* torch's _matches_machine_hostname: localhost, a loopback address, our
 * host name or FQDN, or an address that is one of ours. */
static bool is_this_machine(const char *host)
{
	char me[256] = "", fq[256];
	struct in6_addr a6;
	struct in_addr a4;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *hl = NULL, *ml = NULL;
	bool yes = false;
	if (!strcmp(host, "localhost") || (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
	    (inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)))
		return true;
	gethostname(me, sizeof(me) - 1);
	dptp_getfqdn(fq, sizeof(fq));
	if (!strcmp(host, me) || !strcmp(host, fq))
		return true;
	if (getaddrinfo(host, NULL, &hints, &hl) != 0)
		return false;
	if (getaddrinfo(me, NULL, &hints, &ml) == 0) {
		for (struct addrinfo *m = ml; m && !yes; m = m->ai_next)
			for (struct addrinfo *h = hl; h && !yes; h = h->ai_next)
				yes = m->ai_addrlen == h->ai_addrlen && !memcmp(m->ai_addr, h->ai_addr, m->ai_addrlen);
		freeaddrinfo(ml);
	}
	freeaddrinfo(hl);
	return yes;
}

static int connect_store(struct rendezvous *r, const char *host, unsigned port, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	struct dptp_tcpstore_client_opts co = {.host = host, .port = (uint16_t)port, .timeout = o->c10d.read,
		.abort_fd = &r->abort_fd};
	struct dptp_err e = {0};
	int rc;
	if ((rc = dptp_tcpstore_client_create(&co, &r->c10d->c, &e)) < 0 ||
	    (rc = dptp_tcpstore_client_create(&co, &r->agent, &e)) < 0) {
		if (rc == -EINTR)
			return dptp_err_set(err, rc, "a signal arrived during the rendezvous");
		return dptp_err_set(err, rc, "The connection to the C10d store has failed: %s", e.msg);
	}
	return 0;
}

static int c10d_start(struct rendezvous *r, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	struct rdzv_c10d *c = r->c10d;
	char host[256];
	int port;
	bool host_it;
	DPTP_TRY(run_opts_parse_endpoint(o->rdzv_endpoint, host, sizeof(host), &port, err));
	if (!*host)
		return dptp_err_set(err, -EINVAL, "--rdzv-backend=c10d needs --rdzv-endpoint HOST[:PORT]");
	if (port < 0)
		port = C10D_DEFAULT_PORT;
	host_it = o->c10d.is_host >= 0 ? o->c10d.is_host == 1 : is_this_machine(host);
	if (host_it) {
		struct dptp_tcpstore_server_opts so = {.host = NULL, .port = (uint16_t)port};
		struct dptp_err e = {0};
		if (dptp_tcpstore_server_create(&so, &r->server, &e) == 0 && dptp_tcpstore_server_start(r->server, &e) == 0) {
			info(r, "Process %d hosts the TCP store for the C10d rendezvous backend.", (int)getpid());
		} else {
			dptp_tcpstore_server_destroy(r->server);
			r->server = NULL;
			if (o->c10d.is_host == 1)
				return dptp_err_set(err, -EADDRINUSE, "The connection to the C10d store has failed: is_host=1 but port %d: %s",
					port, e.msg);
			/* another agent on this machine hosts it: torch's retry as a client */
		}
	}
	DPTP_TRY(connect_store(r, host, (unsigned)port, err));
	snprintf(c->host, sizeof(c->host), "%s", host);
	c->port = (unsigned)port;
	snprintf(c->key, sizeof(c->key), "torch.rendezvous.%s", r->run_id);
	/* the backend's constructor: the sentinel unless a state exists */
	struct dptp_tcpstore_buf cur = {0};
	DPTP_TRY(dptp_tcpstore_client_compare_set(c->c, c->key, "", 0, RDZV_NULL_SENTINEL, strlen(RDZV_NULL_SENTINEL), &cur,
		err));
	free(cur.data);
	return 0;
}

/* ---- the round's keys ---------------------------------------------------- */

static int get_str(struct rendezvous *r, const char *key, char *out, size_t len, struct dptp_err *err)
{
	struct dptp_tcpstore_buf b = {0};
	DPTP_TRY(dptp_tcpstore_client_get(r->agent, key, &b, err));
	snprintf(out, len, "%.*s", (int)b.len, b.data ? (char *)b.data : "");
	free(b.data);
	return 0;
}

static int free_port(unsigned *port)
{
	struct sockaddr_in6 a = {.sin6_family = AF_INET6};
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return -e;
	}
	*port = ntohs(a.sin6_port);
	close(fd);
	return 0;
}

/* Removes every key of the workers' store (a restarted job starts clean). */
static void wipe_worker_store(struct rendezvous *r)
{
	struct dptp_tcpstore_client_opts co = {.host = "localhost", .port = (uint16_t)r->c10d->wport, .timeout = 10};
	struct dptp_tcpstore_client *cl = NULL;
	char **keys = NULL;
	size_t n = 0;
	if (dptp_tcpstore_client_create(&co, &cl, NULL) < 0)
		return;
	if (dptp_tcpstore_client_set_prefix(cl, "") == 0 && dptp_tcpstore_client_list_keys(cl, &keys, &n, NULL) == 0)
		for (size_t i = 0; i < n; i++)
			dptp_tcpstore_client_delete_key(cl, keys[i], NULL, NULL);
	dptp_tcpstore_keys_free(keys, n);
	dptp_tcpstore_client_destroy(cl);
}

/* RendezvousStoreInfo.build: rank 0 publishes where the workers' store is. */
static int store_info(struct rendezvous *r, unsigned rank, struct rdzv_info *out, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const char *e = getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE");
	bool shared = !(e && !strcmp(e, "1"));
	char port[32];
	if (rank == 0) {
		unsigned p = 0;
		if (!shared) {
			int rc = free_port(&p);
			if (rc < 0)
				return dptp_err_set(err, rc, "no free port for the workers' store: %s", strerror(-rc));
		} else if (c->wserver) {
			wipe_worker_store(r);
			p = c->wport;
		} else {
			struct dptp_tcpstore_server_opts so = {.host = NULL, .port = 0};
			struct dptp_err se = {0};
			if (dptp_tcpstore_server_create(&so, &c->wserver, &se) < 0 ||
			    dptp_tcpstore_server_start(c->wserver, &se) < 0) {
				dptp_tcpstore_server_destroy(c->wserver);
				c->wserver = NULL;
				return dptp_err_set(err, -EADDRINUSE, "cannot host the workers' store: %s", se.msg);
			}
			p = c->wport = dptp_tcpstore_server_port(c->wserver);
		}
		snprintf(port, sizeof(port), "%u", p);
		DPTP_TRY(dptp_tcpstore_client_set(r->agent, "MASTER_ADDR", c->me.addr, strlen(c->me.addr), err));
		DPTP_TRY(dptp_tcpstore_client_set(r->agent, "MASTER_PORT", port, strlen(port), err));
	}
	DPTP_TRY(get_str(r, "MASTER_ADDR", out->master_addr, sizeof(out->master_addr), err));
	DPTP_TRY(get_str(r, "MASTER_PORT", port, sizeof(port), err));
	char *end;
	unsigned long v = strtoul(port, &end, 10);
	if (end == port || *end || v == 0 || v > 65535)
		return dptp_err_set(err, -EPROTO, "MASTER_PORT '%s' of the rendezvous is not a port", port);
	out->master_port = (unsigned)v;
	out->use_agent_store = shared;
	return 0;
}

/* A completed round as read from the store: as many nodes as --nnodes
 * allows, and ranks 0..n-1, each once (mark_complete's, or torch's). */
static int check_round(struct rendezvous *r, struct dptp_err *err)
{
	const struct rdzv_state *s = r->c10d->st;
	const struct run_opts *o = r->opts;
	bool seen[RDZV_MAX_NODES] = {false};
	if (s->npart < o->min_nodes || s->npart > o->max_nodes)
		return dptp_err_set(err, -EPROTO, "round %lld of the rendezvous '%s' completed with %u nodes; --nnodes=%u:%u",
			s->round, r->run_id, s->npart, o->min_nodes, o->max_nodes);
	for (unsigned i = 0; i < s->npart; i++) {
		long long k = s->rank[i];
		if (k < 0 || k >= (long long)s->npart || seen[k])
			return dptp_err_set(err, -EPROTO, "round %lld of the rendezvous '%s' gives node '%.64s_%lld_%lld' "
				"rank %lld: ranks must be 0..%u, each once", s->round, r->run_id, s->part[i].addr,
				s->part[i].pid, s->part[i].local_id, k, s->npart - 1);
		seen[k] = true;
	}
	return 0;
}

/* Under the round's prefix on the state connection: this node's dptp
 * record, torchrun's rank assignment (agent connection), its check, and
 * every node's record when all are there (out->nodes; else out->mixed). */
static int c10d_round_nodes(struct rendezvous *r, unsigned rank, unsigned world, struct rdzv_info *out, unsigned rk[4],
	struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	char key[64], val[320];
	char **keys = calloc(world, sizeof(*keys));
	bool all = true, ready = false;
	int rc = keys ? 0 : dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; rc == 0 && i < world; i++)
		if (!(keys[i] = malloc(32)))
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
		else
			snprintf(keys[i], 32, "dptp/node/%u", i);
	snprintf(key, sizeof(key), "dptp/node/%u", rank);
	snprintf(val, sizeof(val), "%u %d %u %s", r->opts->nproc, (int)getpid(), rdzv_common_slots(), r->hostname);
	if (rc == 0 && (rc = dptp_tcpstore_client_set(c->c, key, val, strlen(val), err)) == 0)
		rc = dptp_tcpstore_client_check(c->c, (const char *const *)keys, 1, &ready, err);
	if (rc == 0)
		rc = rdzv_common_assign_ranks(r, r->agent, rank, world, rk, err);
	if (rc == 0)
		rc = rdzv_common_check_ranks(r, c->c, rank, world, rk, err);
	if (rc == 0)
		rdzv_common_info_set_ranks(out, rank, world, rk);
	for (unsigned i = 0; rc == 0 && all && i < world; i++) {
		const char *k1[] = {keys[i]};
		rc = dptp_tcpstore_client_check(c->c, k1, 1, &all, err);
	}
	if (rc == 0 && all && world > 1)
		rc = rdzv_common_read_nodes(r, c->c, (const char *const *)keys, world, rank, out, err);
	out->mixed = world > 1 && !all;
	if (keys)
		dptp_tcpstore_keys_free(keys, world);
	return rc;
}

static int c10d_next(struct rendezvous *r, unsigned restart, struct rdzv_info *out, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	struct rdzv_c10d *c = r->c10d;
	char prefix[256];
	unsigned rk[4];
	memset(out, 0, sizeof(*out));
	r->attempt = restart;
	if (!c->c)
		DPTP_TRY(c10d_start(r, err));
	c->heartbeats = false; /* torch stops the heartbeats while it rendezvouses */
	if (!c->joined_once && pause_s(r, (double)(rand() % 300) / 1000.0) < 0) /* torch's first-round skew */
		return dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
	double deadline = dptp_now() + o->c10d.join;
	DPTP_TRY(run_op(r, op_exit, deadline, "leaving the last round", err));
	DPTP_TRY(run_op(r, op_join, deadline, "joining", err));
	c->joined_once = true;
	c->heartbeats = true;

	const struct rdzv_state *s = c->st;
	int me = rdzv_state_nd_find(s->part, s->npart, &c->me);
	if (me < 0)
		return dptp_err_set(err, -EPROTO, "the completed rendezvous does not list this node");
	DPTP_TRY(check_round(r, err));
	unsigned rank = (unsigned)s->rank[me], world = s->npart;
	r->barrier_n = world;
	info(r, "The node '%s_%lld_%lld' has joined round %lld of the rendezvous '%s' as rank %u in a world of size %u.",
		c->me.addr, c->me.pid, c->me.local_id, s->round, r->run_id, rank, world);
	snprintf(prefix, sizeof(prefix), "/torch.rendezvous.%s.%lld/", r->run_id, s->round);
	if (dptp_tcpstore_client_set_prefix(r->agent, prefix) < 0)
		return dptp_err_set(err, -EMSGSIZE, "run id '%s' is too long for a store key", r->run_id);
	DPTP_TRY(store_info(r, rank, out, err));
	/* dptp-run's node record before its role_info, over the state's
	 * connection (a CHECK's reply orders it first): once its ranks are
	 * assigned, a node knows whether every node of the round is a
	 * dptp-run (one PMIx job across them) */
	if (dptp_tcpstore_client_set_prefix(c->c, prefix) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc = c10d_round_nodes(r, rank, world, out, rk, err);
	if (dptp_tcpstore_client_set_prefix(c->c, "/") < 0 && rc == 0)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	DPTP_TRY(rc);
	snprintf(out->run_id, sizeof(out->run_id), "%s", r->run_id);
	snprintf(out->dptp_prefix, sizeof(out->dptp_prefix), "%sdptp/", prefix);
	snprintf(out->store_addr, sizeof(out->store_addr), "%s", c->host);
	out->store_port = c->port;
	/* every node names the job alike: node 0's pid and the round */
	snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%lld", out->nodes ? out->nodes[0].pid : (int)getpid(),
		s->round);
	return 0;
}

int rdzv_c10d_heartbeat(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	/* torch's timer fires every keep_alive_interval and skips when the last
	 * heartbeat is younger: checked here on every call instead, so that a
	 * heartbeat is never up to two intervals old */
	if (c && c->c && c->heartbeats && should_keep_alive(r))
		return run_op(r, op_keep_alive, dptp_now() + r->opts->c10d.heartbeat, "a heartbeat", err);
	return 0;
}

int rdzv_c10d_tick(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	int has_set;
	if (!c || !c->c || !c->joined_once)
		return 0;
	DPTP_TRY(rdzv_c10d_heartbeat(r, err));
	/* num_nodes_waiting() */
	DPTP_TRY(sync_state(r, &has_set, err));
	return (int)c->st->nwait;
}

static void c10d_shutdown(struct rendezvous *r)
{
	struct rdzv_c10d *c = r->c10d;
	if (c && c->c && !r->quick) {
		struct dptp_err err = {0};
		c->heartbeats = false;
		if (run_op(r, op_close, dptp_now() + r->opts->c10d.close, "closing", &err) < 0)
			fprintf(stderr, "dptp-run: warning: the rendezvous could not be closed: %s\n", err.msg);
	}
	if (c) {
		dptp_tcpstore_client_destroy(c->c);
		dptp_tcpstore_server_destroy(c->wserver);
		free(c->token);
		free(c->st);
		free(c);
		r->c10d = NULL;
	}
	rdzv_common_shutdown(r);
}

static const struct rendezvous_ops c10d_ops = {
	.next = c10d_next,
	.shutdown = c10d_shutdown,
};

int rdzv_c10d_init(struct rendezvous *r, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	if (o->max_nodes > RDZV_MAX_NODES)
		return dptp_err_set(err, -EINVAL, "--nnodes=%u:%u: the c10d rendezvous state holds at most %d nodes",
			o->min_nodes, o->max_nodes, RDZV_MAX_NODES);
	struct rdzv_c10d *c = calloc(1, sizeof(*c));
	if (!c || !(c->st = calloc(1, sizeof(*c->st)))) {
		free(c);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	rdzv_state_init(c->st);
	c->last_sync = -1;
	if (o->local_addr && *o->local_addr)
		snprintf(c->me.addr, sizeof(c->me.addr), "%s", o->local_addr);
	else
		dptp_getfqdn(c->me.addr, sizeof(c->me.addr));
	c->me.pid = getpid();
	c->me.local_id = 0;
	r->c10d = c;
	r->ops = &c10d_ops;
	r->multi = true;
	snprintf(r->run_id, sizeof(r->run_id), "%s", o->rdzv_id);
	srand((unsigned)getpid() ^ (unsigned)(dptp_now() * 1e6));
	return 0;
}
