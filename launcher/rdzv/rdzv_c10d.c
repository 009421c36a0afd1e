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
#include <sys/resource.h>
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
	/* heartbeats that do not rewrite the state (see fold()) */
	enum { HB_TORCH, HB_MEMBER, HB_FOLDER } hb;
	bool keep_stale;   /* fold(): reads the state as it is, stale heartbeats and all */
	bool compact;      /* joined by the combiner's result: the state not read since */
	bool fallback;     /* a ticket holder that joined as torch's (DPTP_RDZV_STATS) */
	long long res_round, res_rank;
	unsigned res_world;
	unsigned rank, world;
	char rkey[240];    /* "torch.rendezvous.<run_id>.<round>/dptp/" (under "/") */
	char jkey[240];    /* "torch.rendezvous.<run_id>.dptp.join.<round>/" */
	long long round;
	int64_t *hb_last;  /* the folder: each rank's counter at the last fold */
	int64_t folds_seen, nwait_pub;
	double hb_next, folds_at, nwait_at;
	int nwait;
	/* DPTP_RDZV_STATS: this agent's state traffic, printed at shutdown */
	bool stats;
	unsigned long long n_cas, n_cas_lost, n_get, n_pause, b_sent, b_recv, n_folds, n_beats, n_batches, n_results,
		n_passed;
	long long ticket;
	double t_codec, t_join;
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
	double t0 = dptp_now();
	*has_set = -1;
	if (c->dirty) {
		if ((rc = rdzv_state_encode(c->st, &pk, &pkn, err)) < 0)
			return rc;
		b64 = rdzv_state_b64_encode(pk, pkn);
		free(pk);
		c->t_codec += dptp_now() - t0;
		if (!b64)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		const char *exp = c->token ? c->token : RDZV_NULL_SENTINEL;
		rc = dptp_tcpstore_client_compare_set(c->c, c->key, exp, strlen(exp), b64, strlen(b64), &cur, err);
		if (rc == 0)
			*has_set = cur.len == strlen(b64) && !memcmp(cur.data, b64, cur.len);
		c->n_cas++;
		c->n_cas_lost += *has_set == 0;
		c->b_sent += strlen(exp) + strlen(b64);
		free(b64);
	} else {
		if (c->last_sync >= 0 && dptp_now() - c->last_sync < 1.0)
			return 0; /* torch serves a state younger than 1 s from its cache */
		rc = dptp_tcpstore_client_get(c->c, c->key, &cur, err);
		c->n_get++;
	}
	if (rc < 0)
		return rc;
	c->b_recv += cur.len;
	t0 = dptp_now();
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
	c->compact = false;
	c->last_sync = dptp_now();
	if (!c->keep_stale)
		sanitize(r);
	c->t_codec += dptp_now() - t0;
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

static int cmp_part(const void *a, const void *b)
{
	return rdzv_state_nd_cmp(*(const struct rdzv_nd *const *)a, *(const struct rdzv_nd *const *)b);
}

/* rank = place in sorted order (the nodes are distinct: dict keys) */
static int mark_complete(struct rdzv_state *s)
{
	const struct rdzv_nd **by = malloc((s->npart ? s->npart : 1) * sizeof(*by));
	if (!by)
		return -ENOMEM;
	s->complete = true;
	s->has_deadline = false;
	for (unsigned k = 0; k < s->npart; k++)
		by[k] = &s->part[k];
	qsort(by, s->npart, sizeof(*by), cmp_part);
	for (unsigned k = 0; k < s->npart; k++)
		s->rank[by[k] - s->part] = k;
	free(by);
	return 0;
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
			return mark_complete(s);
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
		return mark_complete(s);
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
	int rc;
	for (;;) {
		int has_set;
		DPTP_TRY(sync_state(r, &has_set, err));
		if (has_set == 0) {
			/* lost to another node's write: back off a random while,
			 * longer the more nodes there are to write (torch retries at
			 * once, so that N nodes redo O(N) writes each) */
			double most = 0.002 * (r->c10d->st->npart + r->c10d->st->nwait + 1);
			if (pause_s(r, (most < 0.5 ? most : 0.5) * (double)(rand() % 1000) / 1000.0) < 0)
				return dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
		}
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
			r->c10d->n_pause++;
			if (pause_s(r, 1.0) < 0)
				return dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
			break;
		default:
			if ((rc = apply(r, a, &deadline)) < 0)
				return rc == -ENOMEM ? dptp_err_set(err, rc, "out of memory")
						     : dptp_err_set(err, -E2BIG, "the rendezvous has more than %d nodes", RDZV_MAX_NODES);
			r->c10d->dirty = true;
		}
	}
}

/* ---- heartbeats that do not rewrite the state ----------------------------
 * torch's keep-alive rewrites the whole state, O(N) bytes, on every node
 * every keep_alive_interval, each write against all the others' (a lost
 * COMPARE_SET reads the winner's state and tries again): O(N^2) bytes and
 * conflicts per interval, past the heartbeat timeout at a few hundred
 * nodes. Where rank 0 of the round is a dptp-run, the dptp-run nodes ADD 1
 * to <round>/dptp/hb/<rank> every half interval instead, and rank 0 folds
 * them: every interval it reads every counter (pipelined ADDs of 0) and
 * writes one state in which every node whose counter moved, and itself,
 * has a heartbeat of now, with COMPARE_SET against the state it read, as
 * torch writes. A torchrun agent reads the state it expects: the nodes that
 * beat stay, the silent ones expire after keep_alive_max_attempt intervals.
 * Rank 0 counts its folds under <round>/dptp/folds and keeps the number of
 * waiting nodes under <round>/dptp/nwait, which the others read instead of
 * the state; a node that sees no fold for keep_alive_max_attempt intervals
 * goes back to torch's keep-alive. */

static int hb_keys(const struct rdzv_c10d *c, const char *const names[], char (*keys)[280], size_t n)
{
	for (size_t i = 0; i < n; i++)
		snprintf(keys[i], sizeof(keys[i]), "%s%s", c->rkey, names[i]);
	return 0;
}

/* Rank 0 writes the nodes' heartbeats into the state, and publishes nwait. */
static int fold(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct run_opts *o = r->opts;
	unsigned n = c->world;
	char (*kb)[280] = calloc(n + 1, sizeof(*kb));
	const char **keys = calloc(n + 1, sizeof(*keys));
	int64_t *zero = calloc(n + 1, sizeof(*zero)), *val = calloc(n + 1, sizeof(*val));
	bool *moved = calloc(n, sizeof(*moved));
	int rc = 0;
	if (!kb || !keys || !zero || !val || !moved) {
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		snprintf(kb[i], sizeof(kb[i]), "%shb/%u", c->rkey, i);
		keys[i] = kb[i];
	}
	if ((rc = dptp_tcpstore_client_add_many(c->c, keys, zero, n, val, err)) < 0)
		goto out;
	for (unsigned i = 0; i < n; i++) {
		moved[i] = val[i] != c->hb_last[i];
		c->hb_last[i] = val[i];
	}
	double deadline = dptp_now() + o->c10d.heartbeat;
	for (;;) {
		int has_set;
		c->last_sync = -1; /* a fresh read */
		c->keep_stale = true; /* the counters say who is alive, not the clock */
		rc = sync_state(r, &has_set, err);
		c->keep_stale = false;
		if (rc < 0)
			goto out;
		struct rdzv_state *st = c->st;
		if (st->round != c->round || rdzv_state_nd_find(st->part, st->npart, &c->me) < 0)
			goto out; /* the round moved on: nothing to keep alive */
		long long now = rdzv_state_now_us();
		for (unsigned i = 0; i < st->npart; i++) {
			long long k = st->rank[i];
			if (k >= 0 && (unsigned long long)k < n && (moved[k] || (unsigned)k == c->rank) &&
			    (rc = nd_put(st->heart, st->heart_us, &st->nheart, &st->part[i], now)) < 0) {
				rc = dptp_err_set(err, -E2BIG, "the rendezvous has more than %d nodes", RDZV_MAX_NODES);
				goto out;
			}
		}
		c->dirty = true;
		c->keep_stale = true;
		rc = sync_state(r, &has_set, err);
		c->keep_stale = false;
		if (rc < 0)
			goto out;
		if (has_set == 1)
			break;
		if (dptp_now() > deadline) {
			rc = dptp_err_set(err, -ETIMEDOUT, "RendezvousTimeoutError: a heartbeat of the rendezvous '%s' timed out",
				r->run_id);
			goto out;
		}
		if (pause_s(r, 0.01 + (double)(rand() % 40) / 1000.0) < 0) {
			rc = dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
			goto out;
		}
	}
	c->n_folds++;
	const char *nk[2];
	char nb[2][280];
	static const char *const names[] = {"folds", "nwait"};
	hb_keys(c, names, nb, 2);
	nk[0] = nb[0];
	nk[1] = nb[1];
	int64_t d[2] = {1, (int64_t)c->st->nwait - c->nwait_pub};
	if ((rc = dptp_tcpstore_client_add_many(c->c, nk, d, 2, NULL, err)) == 0)
		c->nwait_pub = c->st->nwait;
out:
	free(kb);
	free(keys);
	free(zero);
	free(val);
	free(moved);
	return rc;
}

/* A member's heartbeat: its counter, and what rank 0 published. */
static int beat(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct run_opts *o = r->opts;
	static const char *const names[] = {"hb/", "folds", "nwait"};
	char kb[3][280];
	const char *keys[3];
	int64_t d[3] = {1, 0, 0}, v[3];
	hb_keys(c, names, kb, 3);
	snprintf(kb[0], sizeof(kb[0]), "%shb/%u", c->rkey, c->rank);
	for (int i = 0; i < 3; i++)
		keys[i] = kb[i];
	DPTP_TRY(dptp_tcpstore_client_add_many(c->c, keys, d, 3, v, err));
	c->n_beats++;
	double now = dptp_now();
	c->nwait = v[2] > 0 ? (int)v[2] : 0;
	c->nwait_at = now;
	if (v[1] != c->folds_seen) {
		c->folds_seen = v[1];
		c->folds_at = now;
	} else if (now - c->folds_at > (double)o->c10d.keep_alive_interval * o->c10d.keep_alive_max_attempt +
					 (c->folds_seen ? 0 : (double)o->c10d.read)) {
		/* (before its first fold rank 0 may still be in the rendezvous,
		 * waiting for the slowest node's role_info, as long as the read
		 * timeout) */
		char pre[64];
		glog_prefix('W', pre, sizeof(pre));
		fprintf(stderr, "%srank 0 of the rendezvous '%s' has folded no heartbeat for %.0f s; this node writes its own\n",
			pre, r->run_id, now - c->folds_at);
		c->hb = HB_TORCH;
	}
	return 0;
}

/* After a completed join: who keeps the heartbeats (rank 0 a dptp-run?). */
static int hb_begin(struct rendezvous *r, long long round, unsigned rank, unsigned world, bool node0_dptp,
	struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	c->rank = rank;
	c->world = world;
	c->round = round;
	snprintf(c->rkey, sizeof(c->rkey), "torch.rendezvous.%s.%lld/dptp/", r->run_id, c->round);
	c->hb = !node0_dptp || getenv("DPTP_RDZV_TORCH_HEARTBEATS") ? HB_TORCH : rank == 0 ? HB_FOLDER : HB_MEMBER;
	free(c->hb_last);
	c->hb_last = NULL;
	if (c->hb == HB_FOLDER && !(c->hb_last = calloc(world, sizeof(*c->hb_last))))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	c->folds_seen = 0;
	c->nwait_pub = 0;
	c->nwait = 0;
	c->hb_next = 0;
	c->folds_at = c->nwait_at = dptp_now();
	return 0;
}

/* ---- joining through one combiner ---------------------------------------
 * torch's join: every node writes the state with itself added, COMPARE_SET
 * against the state it read; with N nodes at once each write loses to
 * another's and is redone, and past keep_alive_interval every waiting node
 * rewrites the state for its heartbeat too: O(N) writes of O(N) bytes per
 * node (512 nodes on two cores: 980,000 COMPARE_SETs, 22 GB, no round in
 * 300 s). dptp-run nodes take a ticket instead (ADD <join>n 1) and leave
 * their _NodeDesc under <join><ticket>; the holder of ticket 1 adds the
 * tickets' nodes to the state in batches, one COMPARE_SET each, as torch's
 * join would have added them (participant, heartbeat, last-call deadline,
 * completion with the ranks), keeps their heartbeats in the state while the
 * round fills (their counters under <join>hb/<ticket>), and sets <join>done
 * when the round is complete. The others WAIT for that key (no polling of
 * the state) and beat meanwhile. A torchrun agent joins as it always does,
 * its writes merely conflict now and then with the combiner's. A joiner
 * that sees the combiner's counter (<join>alive) stand still for
 * keep_alive_interval * keep_alive_max_attempt, or the round complete
 * without it, joins as torch's does. <join> is
 * "torch.rendezvous.<run_id>.dptp.join.<round>/". */

struct ticket {
	struct rdzv_nd nd;
	int64_t hb;
	bool moved;
	bool none; /* its holder left no _NodeDesc in time: passed over */
};

static int jkey(const struct rdzv_c10d *c, char *out, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int jkey(const struct rdzv_c10d *c, char *out, size_t len, const char *fmt, ...)
{
	va_list ap;
	int k = snprintf(out, len, "%s", c->jkey);
	va_start(ap, fmt);
	vsnprintf(out + k, len - (size_t)k, fmt, ap);
	va_end(ap);
	return 0;
}

/* *upto: the last ticket t of [from, to] such that every ticket of [from, t]
 * has its _NodeDesc (from - 1 when the first has none yet). A holder takes
 * its ticket (ADD), then leaves its _NodeDesc (SET): a holder not scheduled
 * in between must not stop the combiner, whose counter the others watch
 * (a MULTI_GET waits for every key: on 2 cores at 2048 nodes every holder
 * saw the counter stand still for 15 s and read the state as torch's
 * joiners do). A binary search of CHECKs: log2 of the tickets at most. */
static int tickets_ready(struct rendezvous *r, int64_t from, int64_t to, int64_t *upto, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	size_t n = (size_t)(to - from + 1);
	char (*kb)[280] = calloc(n, sizeof(*kb));
	const char **keys = calloc(n, sizeof(*keys));
	int64_t lo = from - 1, hi = to; /* [from, lo] all there; hi: the most that may be */
	int rc = 0;
	if (!kb || !keys)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < n; i++) {
		jkey(c, kb[i], sizeof(kb[i]), "%lld", (long long)from + (long long)i);
		keys[i] = kb[i];
	}
	while (rc == 0 && lo < hi) {
		int64_t mid = lo == from - 1 && hi == to ? to : lo + (hi - lo + 1) / 2;
		bool all = false;
		if ((rc = dptp_tcpstore_client_check(c->c, keys + (lo + 1 - from), (size_t)(mid - lo), &all, err)) < 0)
			break;
		if (all)
			lo = mid;
		else
			hi = mid - 1;
	}
	*upto = lo;
	free(kb);
	free(keys);
	return rc;
}

/* Reads tickets [from, to] into *tk (index ticket - 1). */
static int read_tickets(struct rendezvous *r, struct ticket **tk, size_t *cap, int64_t from, int64_t to,
	struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	size_t n = (size_t)(to - from + 1);
	char (*kb)[280] = calloc(n, sizeof(*kb));
	const char **keys = calloc(n, sizeof(*keys));
	struct dptp_tcpstore_buf *vals = NULL;
	int rc = 0;
	if (!kb || !keys || ((size_t)to > *cap && !(*tk = realloc(*tk, (size_t)to * 2 * sizeof(**tk))))) {
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	if ((size_t)to > *cap)
		*cap = (size_t)to * 2;
	for (size_t i = 0; i < n; i++) {
		jkey(c, kb[i], sizeof(kb[i]), "%lld", (long long)from + (long long)i);
		keys[i] = kb[i];
	}
	if ((rc = dptp_tcpstore_client_multi_get(c->c, keys, n, &vals, err)) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		struct ticket *t = &(*tk)[from - 1 + (int64_t)i];
		int used = 0;
		memset(t, 0, sizeof(*t));
		if (!vals[i].data || sscanf((char *)vals[i].data, "%lld %lld %n", &t->nd.pid, &t->nd.local_id, &used) < 2 ||
		    !used || vals[i].len - (size_t)used >= sizeof(t->nd.addr)) {
			rc = dptp_err_set(err, -EPROTO, "join ticket %lld of the rendezvous '%s' is malformed: '%.100s'",
				(long long)from + (long long)i, r->run_id, vals[i].data ? (char *)vals[i].data : "");
			break;
		}
		snprintf(t->nd.addr, sizeof(t->nd.addr), "%s", (char *)vals[i].data + used);
		t->hb = -1;
	}
	dptp_tcpstore_bufs_free(vals, n);
out:
	free(kb);
	free(keys);
	return rc;
}

/* torch's ADD_PART for node nd, as its own join would. */
static int add_part(struct rendezvous *r, const struct rdzv_nd *nd, long long now)
{
	struct rdzv_state *s = r->c10d->st;
	const struct run_opts *o = r->opts;
	nd_remove(s->wait, NULL, &s->nwait, nd);
	DPTP_TRY(nd_put(s->part, s->rank, &s->npart, nd, 0));
	DPTP_TRY(nd_put(s->heart, s->heart_us, &s->nheart, nd, now));
	if (s->npart == o->min_nodes) {
		s->has_deadline = true;
		s->deadline_us = now + (long long)o->c10d.last_call * 1000000;
	}
	if (s->npart == o->max_nodes)
		return mark_complete(s);
	return 0;
}

/* The tickets' nodes into the state read last (a no-op when all are in);
 * heartbeats of now for the ones that beat since the last refresh. */
static int combine_apply(struct rendezvous *r, const struct ticket *tk, size_t n, bool add, bool refresh, bool *changed)
{
	struct rdzv_state *s = r->c10d->st;
	const struct run_opts *o = r->opts;
	struct rdzv_nd_index ix = {0};
	long long now = rdzv_state_now_us();
	*changed = false;
	if (rdzv_nd_index_init(&ix, s->npart + n) < 0)
		return -ENOMEM;
	for (unsigned i = 0; i < s->npart; i++)
		rdzv_nd_index_put(&ix, &s->part[i], i);
	int rc = 0;
	for (size_t i = 0; rc == 0 && add && i < n && !s->complete; i++) {
		if (tk[i].none || rdzv_nd_index_find(&ix, &tk[i].nd) >= 0)
			continue;
		if ((rc = add_part(r, &tk[i].nd, now)) == 0) {
			rdzv_nd_index_put(&ix, &tk[i].nd, 0);
			*changed = true;
		}
	}
	for (size_t i = 0; rc == 0 && refresh && i < n; i++)
		if ((i == 0 || tk[i].moved) && rdzv_nd_index_find(&ix, &tk[i].nd) >= 0 &&
		    rdzv_state_nd_find(s->heart, s->nheart, &tk[i].nd) >= 0) {
			rc = nd_put(s->heart, s->heart_us, &s->nheart, &tk[i].nd, now);
			*changed = true;
		}
	if (rc == 0 && !s->complete && s->npart >= o->min_nodes && s->npart <= o->max_nodes && s->has_deadline &&
	    s->deadline_us < now && rdzv_nd_index_find(&ix, &r->c10d->me) >= 0) {
		rc = mark_complete(s); /* last call is over */
		*changed = true;
	}
	rdzv_nd_index_free(&ix);
	return rc;
}

/* Reads the tickets' heartbeat counters; moved: changed since the last read. */
static int read_beats(struct rendezvous *r, struct ticket *tk, size_t n, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	char (*kb)[280] = calloc(n, sizeof(*kb));
	const char **keys = calloc(n, sizeof(*keys));
	int64_t *zero = calloc(n, sizeof(*zero)), *v = calloc(n, sizeof(*v));
	int rc = 0;
	if (!kb || !keys || !zero || !v)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < n; i++) {
		jkey(c, kb[i], sizeof(kb[i]), "hb/%zu", i + 1);
		keys[i] = kb[i];
	}
	if (rc == 0 && (rc = dptp_tcpstore_client_add_many(c->c, keys, zero, n, v, err)) == 0)
		for (size_t i = 0; i < n; i++) {
			tk[i].moved = v[i] != tk[i].hb;
			tk[i].hb = v[i];
		}
	free(kb);
	free(keys);
	free(zero);
	free(v);
	return rc;
}

/* The combiner of a complete round tells each ticket holder it added its
 * rank: <join>r/<ticket> = "<round> <rank> <world>" (one MULTI_SET, before
 * <join>done), so that a holder reads O(1) bytes, not the state (O(N)
 * bytes; N holders reading it at once were O(N^2) bytes through the store:
 * 3.0 GB at 4096 nodes). Holders it did not add (later tickets) find no
 * key and read the state as torch does. */
static int publish_results(struct rendezvous *r, const struct ticket *tk, size_t ntk, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct rdzv_state *s = c->st;
	struct rdzv_nd_index ix = {0};
	char (*kb)[280] = calloc(ntk, sizeof(*kb)), (*vb)[64] = calloc(ntk, sizeof(*vb));
	const char **keys = calloc(ntk, sizeof(*keys));
	struct dptp_tcpstore_buf *vals = calloc(ntk, sizeof(*vals));
	size_t n = 0;
	int rc = 0;
	if (!kb || !vb || !keys || !vals || rdzv_nd_index_init(&ix, s->npart) < 0) {
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < s->npart; i++)
		rdzv_nd_index_put(&ix, &s->part[i], i);
	for (size_t t = 1; t < ntk; t++) { /* ticket 1, the combiner, has the state */
		long long i = rdzv_nd_index_find(&ix, &tk[t].nd);
		if (i < 0)
			continue;
		jkey(c, kb[n], sizeof(kb[n]), "r/%zu", t + 1);
		snprintf(vb[n], sizeof(vb[n]), "%lld %lld %u", s->round, s->rank[i], s->npart);
		keys[n] = kb[n];
		vals[n].data = (uint8_t *)vb[n];
		vals[n].len = strlen(vb[n]);
		n++;
	}
	if (n)
		rc = dptp_tcpstore_client_multi_set(c->c, keys, vals, n, err);
	c->n_results += n;
out:
	rdzv_nd_index_free(&ix);
	free(kb);
	free(vb);
	free(keys);
	free(vals);
	return rc;
}

static void hint_key(const struct rendezvous *r, char *out, size_t len, const char *what)
{
	snprintf(out, len, "torch.rendezvous.%s.dptp.%s", r->run_id, what);
}

/* How often the combiner reads and writes the state while the round fills:
 * the state is O(nodes) bytes (about 180 per node), so the interval grows
 * with the nodes it holds, about 0.75 MB/s of the combiner's reads at most:
 * 0.08 s at 128 nodes, 0.3 s at 1024, a second from about 3800. A torchrun
 * agent's join is seen through these reads (it takes no ticket): in a round
 * of 127 dptp-run agents and one torchrun agent the combiner learnt that
 * the torchrun agent had completed the round up to a second late (rdzv
 * 0.72 s against 0.31 s for 128 dptp-run agents, H100 box). */
static double combine_interval(const struct rdzv_state *st, size_t pending)
{
	double iv = 0.05 + 0.00025 * (double)(st->nheart + pending);
	return iv < 1.0 ? iv : 1.0;
}

static int combine(struct rendezvous *r, long long round, double deadline, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct run_opts *o = r->opts;
	struct ticket *tk = calloc(64, sizeof(*tk));
	size_t cap = 64, ntk = 1, ntk_written = 0;
	double last_poll = 0, last_write = -1e9, last_refresh = dptp_now(), gap_since = -1;
	/* a ticket whose holder left no _NodeDesc within this is passed over
	 * (the holder, if it comes, gets no result and joins as torch's
	 * joiners do): a holder killed between its ADD and its SET must not
	 * hold back every later ticket until the join timeout */
	double gap_most = o->c10d.keep_alive_interval > 2 ? o->c10d.keep_alive_interval : 2;
	int rc = 0;
	char kn[280], kd[280], ka[280], knext[280], kr[280], rv[32];
	if (!tk)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	tk[0].nd = c->me;
	jkey(c, kn, sizeof(kn), "n");
	jkey(c, kd, sizeof(kd), "done");
	jkey(c, ka, sizeof(ka), "alive");
	/* the joiners of a first round take their tickets here without
	 * reading the state (round_hint) */
	hint_key(r, kr, sizeof(kr), "round");
	snprintf(rv, sizeof(rv), "%lld", round);
	if ((rc = dptp_tcpstore_client_set(c->c, kr, rv, strlen(rv), err)) < 0) {
		free(tk);
		return rc;
	}
	for (;;) {
		double now = dptp_now();
		int64_t n = 0, one = 1;
		const char *k1[] = {kn}, *k2[] = {ka};
		if (now > deadline)
			break; /* torch's join reports the timeout */
		if ((rc = dptp_tcpstore_client_add_many(c->c, k2, &one, 1, NULL, err)) < 0 ||
		    (rc = dptp_tcpstore_client_add(c->c, k1[0], 0, &n, err)) < 0)
			break;
		int64_t upto = (int64_t)ntk;
		if ((size_t)n > ntk && (rc = tickets_ready(r, (int64_t)ntk + 1, n, &upto, err)) < 0)
			break;
		if (upto > (int64_t)ntk) {
			if ((rc = read_tickets(r, &tk, &cap, (int64_t)ntk + 1, upto, err)) < 0)
				break;
			ntk = (size_t)upto;
			gap_since = -1;
		} else if ((size_t)n > ntk && gap_since < 0) {
			gap_since = now;
		} else if ((size_t)n > ntk && now - gap_since > gap_most) {
			if (ntk + 1 > cap) {
				struct ticket *g = realloc(tk, (ntk + 1) * 2 * sizeof(*tk));
				if (!g) {
					rc = dptp_err_set(err, -ENOMEM, "out of memory");
					break;
				}
				tk = g;
				cap = (ntk + 1) * 2;
			}
			memset(&tk[ntk], 0, sizeof(tk[ntk]));
			tk[ntk].none = true;
			tk[ntk].hb = -1;
			ntk++;
			gap_since = -1;
			c->n_passed++;
		}
		bool refresh = now - last_refresh >= o->c10d.keep_alive_interval / 2.0;
		if (refresh) {
			if ((rc = read_beats(r, tk, ntk, err)) < 0)
				break;
			last_refresh = now;
		}
		/* the tickets go in once per combine_interval (a second from about
		 * 3800 nodes), at once where they complete the round or bring it
		 * to min_nodes (the last call starts): the bytes written per
		 * second stay bounded, whatever the number of nodes */
		const struct rdzv_state *st = c->st;
		size_t npend = ntk - ntk_written;
		double iv = combine_interval(st, npend);
		bool add = npend && (now - last_write >= iv || st->npart + npend >= o->max_nodes ||
				     (st->npart < o->min_nodes && st->npart + npend >= o->min_nodes));
		bool due = st->has_deadline && st->deadline_us <= rdzv_state_now_us();
		if (add || refresh || due || now - last_poll >= iv) {
			int has_set;
			c->last_sync = -1;
			if ((rc = sync_state(r, &has_set, err)) < 0)
				goto out;
			while (!c->st->closed && c->st->round == round) { /* add, write; again on a lost write */
				bool changed = false;
				if ((rc = combine_apply(r, tk, ntk, add, refresh, &changed)) < 0) {
					rc = rc == -ENOMEM ? dptp_err_set(err, rc, "out of memory")
							   : dptp_err_set(err, rc, "the rendezvous has more than %d nodes", RDZV_MAX_NODES);
					goto out;
				}
				if (!changed)
					break;
				c->dirty = true;
				c->n_batches++;
				if ((rc = sync_state(r, &has_set, err)) < 0)
					goto out;
				if (has_set == 1) {
					ntk_written = add ? ntk : ntk_written;
					last_write = dptp_now();
					break;
				}
			}
			last_poll = dptp_now();
		}
		if (c->st->complete || c->st->closed || c->st->round != round)
			break;
		/* the next ticket, or the next read of the state; then a short
		 * while for more */
		jkey(c, knext, sizeof(knext), "%lld", (long long)ntk + 1);
		const char *kw[] = {knext};
		double wait = combine_interval(c->st, ntk - ntk_written);
		wait = wait < 0.5 ? wait : 0.5;
		if (c->st->has_deadline) {
			double dl = (double)(c->st->deadline_us - rdzv_state_now_us()) / 1e6;
			wait = dl < wait ? (dl > 0.001 ? dl : 0.001) : wait;
		}
		rc = dptp_tcpstore_client_wait(c->c, kw, 1, wait, err);
		if (rc == 0 && pause_s(r, 0.05) < 0)
			rc = -EINTR;
		if (rc == -EINTR) {
			rc = dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
			break;
		}
		if (rc < 0 && rc != -ETIMEDOUT)
			break;
		rc = 0;
	}
	if (rc == 0 && c->st->complete && !c->st->closed && c->st->round == round)
		rc = publish_results(r, tk, ntk, err);
	if (rc == 0) { /* the others stop waiting, whatever the round became */
		const char *k1[] = {kd};
		int64_t one = 1;
		rc = dptp_tcpstore_client_add_many(c->c, k1, &one, 1, NULL, err);
	}
out:
	free(tk);
	c->last_sync = -1;
	return rc;
}

/* A ticket holder but the first: waits for the combiner's "done". */
static int await_combiner(struct rendezvous *r, long long t, double deadline, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct run_opts *o = r->opts;
	char kd[280], ka[280], kh[280];
	const char *kw[] = {kd}, *kb[] = {kh, ka};
	int64_t alive = -1, d[2] = {1, 0}, v[2];
	double seen = dptp_now(), lease = (double)o->c10d.keep_alive_interval * o->c10d.keep_alive_max_attempt;
	/* a beat per half interval is what the combiner reads (read_beats):
	 * waking more often only loads the store (each wake: WAIT, CANCEL_WAIT,
	 * two ADDs) */
	double slice = o->c10d.keep_alive_interval / 2.0;
	slice = slice > 2.5 ? 2.5 : slice < 0.1 ? 0.1 : slice;
	jkey(c, kd, sizeof(kd), "done");
	jkey(c, ka, sizeof(ka), "alive");
	jkey(c, kh, sizeof(kh), "hb/%lld", t);
	for (;;) {
		double left = deadline - dptp_now();
		if (left <= 0)
			break;
		int rc = dptp_tcpstore_client_wait(c->c, kw, 1, left < slice ? left : slice, err);
		if (rc == 0)
			break;
		if (rc != -ETIMEDOUT)
			return rc == -EINTR ? dptp_err_set(err, rc, "a signal arrived during the rendezvous") : rc;
		DPTP_TRY(dptp_tcpstore_client_add_many(c->c, kb, d, 2, v, err));
		c->n_beats++;
		if (v[1] != alive) {
			alive = v[1];
			seen = dptp_now();
		} else if (dptp_now() - seen > lease) {
			break; /* the combiner is gone: torch's join */
		}
	}
	c->last_sync = -1;
	return 0;
}

/* A ticket holder's rank from the combiner (publish_results): *joined when
 * there is one for round. */
static int take_result(struct rendezvous *r, long long t, long long round, bool *joined, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct run_opts *o = r->opts;
	char key[280];
	const char *k[] = {key};
	bool there = false;
	struct dptp_tcpstore_buf b = {0};
	long long rd, rank;
	unsigned world;
	int used = 0;
	jkey(c, key, sizeof(key), "r/%lld", t);
	DPTP_TRY(dptp_tcpstore_client_check(c->c, k, 1, &there, err));
	if (!there)
		return 0;
	DPTP_TRY(dptp_tcpstore_client_get(c->c, key, &b, err));
	int ok = b.data && sscanf((char *)b.data, "%lld %lld %u%n", &rd, &rank, &world, &used) == 3 &&
		 (size_t)used == b.len && rd == round && world >= o->min_nodes && world <= o->max_nodes && rank >= 0 &&
		 rank < (long long)world;
	if (!ok) {
		int rc = dptp_err_set(err, -EPROTO, "the rendezvous '%s' gives join ticket %lld '%.60s' (round %lld of "
			"--nnodes=%u:%u expected)", r->run_id, t, b.data ? (char *)b.data : "", round, o->min_nodes,
			o->max_nodes);
		free(b.data);
		return rc;
	}
	free(b.data);
	c->res_round = rd;
	c->res_rank = rank;
	c->res_world = world;
	c->compact = true; /* the state is read again before it is used */
	c->last_sync = -1;
	*joined = true;
	return 0;
}

/* The round a first-round joiner takes its ticket in, without reading the
 * state (O(N) bytes when many nodes have joined): the first dptp-run agent
 * of the run id (ADD <run_id>.dptp.first) reads the state and SETs
 * <run_id>.dptp.round, as does every combiner; the others WAIT for it (the
 * read timeout at most). *round = -1: read the state. A stale round costs a
 * fallback, not a wrong rank: its combiner has said done without a result
 * for a later ticket, and torch's join follows. */
static int round_hint(struct rendezvous *r, double deadline, long long *round, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	char kf[280], kr[280];
	const char *k[] = {kr};
	int64_t v = 0;
	struct dptp_tcpstore_buf b = {0};
	char *end;
	*round = -1;
	hint_key(r, kf, sizeof(kf), "first");
	hint_key(r, kr, sizeof(kr), "round");
	DPTP_TRY(dptp_tcpstore_client_add(c->c, kf, 1, &v, err));
	if (v == 1)
		return 0;
	double left = deadline - dptp_now(), most = r->opts->c10d.read;
	if (left <= 0)
		return 0;
	int rc = dptp_tcpstore_client_wait(c->c, k, 1, left < most ? left : most, err);
	if (rc == -ETIMEDOUT)
		return 0;
	if (rc == -EINTR)
		return dptp_err_set(err, rc, "a signal arrived during the rendezvous");
	DPTP_TRY(rc);
	DPTP_TRY(dptp_tcpstore_client_get(c->c, kr, &b, err));
	long long v2 = b.data ? strtoll((char *)b.data, &end, 10) : -1;
	if (b.data && end != (char *)b.data && !*end && v2 >= 0)
		*round = v2;
	free(b.data);
	return 0;
}

/* Joins through the combiner where the round is open and this node in no
 * list yet (hint >= 0: round hint's, the state unread); *joined when the
 * combiner's result gave this node its rank. torch's join (run_op(op_join))
 * follows where not. */
static int combined_join(struct rendezvous *r, long long hint, double deadline, bool *joined, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	const struct rdzv_state *s = c->st;
	char key[280], val[320];
	int has_set;
	int64_t t = 0;
	long long round = hint;
	*joined = false;
	if (hint < 0) {
		c->last_sync = -1;
		DPTP_TRY(sync_state(r, &has_set, err));
		if (!c->joined_once) { /* the first agent of the run id (round_hint) */
			char rv[32];
			hint_key(r, key, sizeof(key), "round");
			snprintf(rv, sizeof(rv), "%lld", s->round);
			DPTP_TRY(dptp_tcpstore_client_set(c->c, key, rv, strlen(rv), err));
		}
		if (s->closed || s->complete || rdzv_state_nd_find(s->part, s->npart, &c->me) >= 0 ||
		    rdzv_state_nd_find(s->wait, s->nwait, &c->me) >= 0 ||
		    rdzv_state_nd_find(s->redund, s->nredund, &c->me) >= 0)
			return 0;
		round = s->round;
	}
	snprintf(c->jkey, sizeof(c->jkey), "torch.rendezvous.%s.dptp.join.%lld/", r->run_id, round);
	jkey(c, key, sizeof(key), "n");
	DPTP_TRY(dptp_tcpstore_client_add(c->c, key, 1, &t, err));
	c->ticket = t;
	jkey(c, key, sizeof(key), "%lld", (long long)t);
	snprintf(val, sizeof(val), "%lld %lld %s", c->me.pid, c->me.local_id, c->me.addr);
	DPTP_TRY(dptp_tcpstore_client_set(c->c, key, val, strlen(val), err));
	if (t == 1)
		return combine(r, round, deadline, err);
	DPTP_TRY(await_combiner(r, t, deadline, err));
	return take_result(r, t, round, joined, err);
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
		.abort_fd = &r->abort_fd, .retry_max = rdzv_common_retry_max(o->max_nodes)};
	struct dptp_err e = {0};
	int rc;
	/* torch's agent and backend share one TCPStore; here two clients (the
	 * agent's keys under a per-round prefix, the state's raw) on one
	 * connection: a store of N nodes holds fewer descriptors */
	if ((rc = dptp_tcpstore_client_create(&co, &r->c10d->c, &e)) < 0 ||
	    (rc = dptp_tcpstore_client_share(r->c10d->c, &r->agent, &e)) < 0) {
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
	struct dptp_err fds = {0};
	int fd_rc = host_it ? rdzv_common_fd_budget(o->max_nodes, RDZV_FDS_PER_NODE, &fds) : 0;
	if (fd_rc < 0 && o->c10d.is_host == 1)
		return dptp_err_set(err, fd_rc, "%s", fds.msg);
	if (host_it) {
		struct dptp_tcpstore_server_opts so = {.host = NULL, .port = (uint16_t)port};
		struct dptp_err e = {0};
		/* the budget grows with the nodes: each reads the state, O(N)
		 * bytes, at about the same moment (DPTP_STORE_MAX_BYTES rules) */
		if (!getenv("DPTP_STORE_MAX_BYTES") && o->max_nodes > 256)
			so.max_total_bytes = DPTP_TCPSTORE_DEFAULT_TOTAL_BYTES + (size_t)o->max_nodes * 512 * 1024;
		if (dptp_tcpstore_server_create(&so, &r->server, &e) == 0 && fd_rc < 0) {
			/* this agent would host the store, without the descriptors */
			dptp_tcpstore_server_destroy(r->server);
			r->server = NULL;
			return dptp_err_set(err, fd_rc, "%s", fds.msg);
		}
		if (r->server && dptp_tcpstore_server_start(r->server, &e) == 0) {
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
	/* the backend's constructor: the sentinel unless a state exists.
	 * torch's COMPARE_SET against "" answers with the state when there is
	 * one: O(N) bytes for each node that starts late, so a CHECK first (a
	 * state created meanwhile merely fails the COMPARE_SET) */
	struct dptp_tcpstore_buf cur = {0};
	const char *k[] = {c->key};
	bool there = false;
	DPTP_TRY(dptp_tcpstore_client_check(c->c, k, 1, &there, err));
	if (!there)
		DPTP_TRY(dptp_tcpstore_client_compare_set(c->c, c->key, "", 0, RDZV_NULL_SENTINEL,
			strlen(RDZV_NULL_SENTINEL), &cur, err));
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
 * record, torchrun's rank assignment (agent connection), and every node's
 * record (out->nodes; else out->mixed). Rank 0, a dptp-run, waits for every
 * role_info first and publishes the records in one value (dptp/nodes, see
 * rdzv_common_publish_nodes) before it assigns the ranks: each node reads
 * that once, O(N) bytes, instead of CHECKing and reading O(N) keys. Where
 * rank 0 is a torchrun (no dptp/nodes once ranks are assigned), the round
 * is mixed, and this node checks its assignment against the role_infos. */
static int c10d_round_nodes(struct rendezvous *r, unsigned rank, unsigned world, struct rdzv_info *out, unsigned rk[4],
	bool *node0_dptp, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	char key[64], val[320];
	const char *agg = "dptp/nodes";
	char **keys = calloc(world, sizeof(*keys));
	bool ready = false;
	int rc = keys ? 0 : dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; rc == 0 && i < world; i++)
		if (!(keys[i] = malloc(40)))
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
		else
			snprintf(keys[i], 40, rank == 0 ? RDZV_RI_PREFIX "%u" : "dptp/node/%u", i);
	snprintf(key, sizeof(key), "dptp/node/%u", rank);
	snprintf(val, sizeof(val), "%u %d %u %s", r->opts->nproc, (int)getpid(), rdzv_common_slots(), r->hostname);
	if (rc == 0 && (rc = dptp_tcpstore_client_set(c->c, key, val, strlen(val), err)) == 0)
		rc = dptp_tcpstore_client_check(c->c, (const char *const *)&keys[rank], 1, &ready, err);
	if (rc == 0 && rank == 0 && world > 1) {
		/* every other node's role_info, so every record is in */
		if ((rc = dptp_tcpstore_client_wait(r->agent, (const char *const *)keys + 1, world - 1, r->opts->c10d.read,
			     err)) == -ETIMEDOUT)
			rc = dptp_err_set(err, rc, "not every node of the round wrote its role_info within %u s",
				r->opts->c10d.read);
		for (unsigned i = 0; rc == 0 && i < world; i++)
			snprintf(keys[i], 40, "dptp/node/%u", i);
		if (rc == 0)
			rc = rdzv_common_publish_nodes(r, c->c, (const char *const *)keys, world, agg, err);
	}
	if (rc == 0)
		rc = rdzv_common_assign_ranks(r, r->agent, rank, world, rk, err);
	if (rc == 0)
		rdzv_common_info_set_ranks(out, rank, world, rk);
	/* rank 0's table preceded its assignment, which we have read */
	if (rc == 0)
		rc = dptp_tcpstore_client_check(c->c, &agg, 1, node0_dptp, err);
	if (rc == 0 && *node0_dptp && world > 1)
		rc = rdzv_common_read_published(r, c->c, agg, world, rank, out, NULL, err);
	else if (rc == 0)
		out->mixed = world > 1;
	if (rc == 0 && out->mixed)
		rc = rdzv_common_check_ranks(r, c->c, rank, world, rk, err);
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
	info(r, "The node '%s_%lld_%lld' attempts to join the next round of the rendezvous '%s'.", c->me.addr, c->me.pid,
		c->me.local_id, r->run_id);
	if (!c->c)
		DPTP_TRY(c10d_start(r, err));
	c->heartbeats = false; /* torch stops the heartbeats while it rendezvouses */
	double deadline = dptp_now() + o->c10d.join;
	bool torch_join = getenv("DPTP_RDZV_TORCH_JOIN") != NULL, joined = false;
	long long hint = -1;
	/* a first round: this process is in no round yet, nothing to leave */
	if (!torch_join && !c->joined_once)
		DPTP_TRY(round_hint(r, deadline, &hint, err));
	if (hint < 0)
		DPTP_TRY(run_op(r, op_exit, deadline, "leaving the last round", err));
	if (!torch_join)
		DPTP_TRY(combined_join(r, hint, deadline, &joined, err));
	/* torch's first-round skew (0-0.3 s, against N joiners writing the
	 * state at once) where this node joins as torch's do; a ticket is one
	 * ADD, and the skew held every round of dptp-run nodes back by its
	 * slowest draw (0.3 s of the 0.31-0.36 s rendezvous of 128 nodes) */
	if (!joined && !c->joined_once && pause_s(r, (double)(rand() % 300) / 1000.0) < 0)
		return dptp_err_set(err, -EINTR, "a signal arrived during the rendezvous");
	if (!joined)
		DPTP_TRY(run_op(r, op_join, deadline, "joining", err));
	c->t_join = dptp_now() - (deadline - o->c10d.join);
	c->fallback = c->ticket > 1 && !joined;
	c->joined_once = true;
	c->heartbeats = true;

	const struct rdzv_state *s = c->st;
	unsigned rank, world;
	long long round;
	if (joined) { /* the combiner's result (take_result checked it) */
		rank = (unsigned)c->res_rank;
		world = c->res_world;
		round = c->res_round;
	} else {
		int me = rdzv_state_nd_find(s->part, s->npart, &c->me);
		if (me < 0)
			return dptp_err_set(err, -EPROTO, "the completed rendezvous does not list this node");
		DPTP_TRY(check_round(r, err));
		rank = (unsigned)s->rank[me];
		world = s->npart;
		round = s->round;
	}
	r->barrier_n = world;
	info(r, "The node '%s_%lld_%lld' has joined round %lld of the rendezvous '%s' as rank %u in a world of size %u.",
		c->me.addr, c->me.pid, c->me.local_id, round, r->run_id, rank, world);
	snprintf(prefix, sizeof(prefix), "/torch.rendezvous.%s.%lld/", r->run_id, round);
	if (dptp_tcpstore_client_set_prefix(r->agent, prefix) < 0)
		return dptp_err_set(err, -EMSGSIZE, "run id '%s' is too long for a store key", r->run_id);
	DPTP_TRY(store_info(r, rank, out, err));
	/* dptp-run's node record before its role_info, over the state's
	 * connection (a CHECK's reply orders it first): once its ranks are
	 * assigned, a node knows whether every node of the round is a
	 * dptp-run (one PMIx job across them) */
	if (dptp_tcpstore_client_set_prefix(c->c, prefix) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	bool node0_dptp = false;
	int rc = c10d_round_nodes(r, rank, world, out, rk, &node0_dptp, err);
	if (rc == 0)
		rc = hb_begin(r, round, rank, world, node0_dptp, err);
	if (dptp_tcpstore_client_set_prefix(c->c, "/") < 0 && rc == 0)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	DPTP_TRY(rc);
	snprintf(out->run_id, sizeof(out->run_id), "%s", r->run_id);
	snprintf(out->dptp_prefix, sizeof(out->dptp_prefix), "%sdptp/", prefix);
	snprintf(out->store_addr, sizeof(out->store_addr), "%s", c->host);
	out->store_port = c->port;
	/* every node names the job alike: node 0's pid and the round */
	snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%lld", out->nodes ? out->nodes[0].pid : (int)getpid(),
		round);
	return 0;
}

int rdzv_c10d_heartbeat(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	if (!c || !c->c || !c->heartbeats)
		return 0;
	if (c->hb != HB_TORCH) {
		double now = dptp_now(), iv = r->opts->c10d.keep_alive_interval;
		if (now < c->hb_next)
			return 0;
		c->hb_next = now + (c->hb == HB_FOLDER ? iv : iv / 2);
		if (c->hb == HB_FOLDER)
			return fold(r, err);
		DPTP_TRY(beat(r, err));
		if (c->hb != HB_TORCH)
			return 0;
	}
	/* torch's timer fires every keep_alive_interval and skips when the last
	 * heartbeat is younger: checked here on every call instead, so that a
	 * heartbeat is never up to two intervals old (on the state as read:
	 * after a join by the combiner's result, read it first) */
	if (c->compact) {
		int has_set;
		DPTP_TRY(sync_state(r, &has_set, err));
	}
	if (should_keep_alive(r))
		return run_op(r, op_keep_alive, dptp_now() + r->opts->c10d.heartbeat, "a heartbeat", err);
	return 0;
}

void rdzv_c10d_report_error(struct rendezvous *r)
{
	struct rdzv_c10d *c = r->c10d;
	char val[32];
	if (!c || !r->agent || !c->heartbeats) /* heartbeats: a round completed, r->agent under its prefix */
		return;
	snprintf(val, sizeof(val), "%u", c->rank);
	dptp_tcpstore_client_set(r->agent, "dptp/failed", val, strlen(val), NULL);
}

int rdzv_c10d_tick(struct rendezvous *r, struct dptp_err *err)
{
	struct rdzv_c10d *c = r->c10d;
	int has_set;
	if (!c || !c->c || !c->joined_once)
		return 0;
	DPTP_TRY(rdzv_c10d_heartbeat(r, err));
	if (c->hb == HB_MEMBER && c->heartbeats) { /* rank 0's count, at most a second old */
		if (dptp_now() - c->nwait_at >= 1.0) {
			char kb[1][280];
			static const char *const names[] = {"nwait"};
			const char *keys[1] = {kb[0]};
			int64_t d = 0, v = 0;
			hb_keys(c, names, kb, 1);
			DPTP_TRY(dptp_tcpstore_client_add_many(c->c, keys, &d, 1, &v, err));
			c->nwait = v > 0 ? (int)v : 0;
			c->nwait_at = dptp_now();
		}
		return c->nwait;
	}
	/* num_nodes_waiting() */
	DPTP_TRY(sync_state(r, &has_set, err));
	if (c->hb == HB_FOLDER && c->heartbeats && (int64_t)c->st->nwait != c->nwait_pub) {
		char kb[1][280];
		static const char *const names[] = {"nwait"};
		const char *keys[1] = {kb[0]};
		int64_t d = (int64_t)c->st->nwait - c->nwait_pub;
		hb_keys(c, names, kb, 1);
		DPTP_TRY(dptp_tcpstore_client_add_many(c->c, keys, &d, 1, NULL, err));
		c->nwait_pub = c->st->nwait;
	}
	return (int)c->st->nwait;
}

/* Closing: every node of torch's writes closed=true, all at once, one
 * COMPARE_SET each against the others': N reads and writes of O(N) bytes.
 * Where rank 0 folds the heartbeats (a dptp-run), the first node to shut
 * down (ADD <round>/dptp/closer: 1) closes, as torch's first would, and says
 * so under <round>/dptp/closed; the others wait for that (up to the close
 * timeout) and close themselves only without it. (Rank 0 closed for all
 * before: a rank 0 that came late, the store's host at 4096 nodes, made
 * every node close itself after 5 s.) */
static bool closed_by_another(struct rendezvous *r, bool *closer)
{
	struct rdzv_c10d *c = r->c10d;
	char kb[2][280];
	static const char *const names[] = {"closed", "closer"};
	const char *keys[1] = {kb[0]}, *ck[1] = {kb[1]};
	int64_t one = 1, v = 0;
	*closer = false;
	if (c->hb == HB_TORCH)
		return false;
	hb_keys(c, names, kb, 2);
	if (dptp_tcpstore_client_add_many(c->c, ck, &one, 1, &v, NULL) < 0 || v == 1) {
		*closer = true;
		return false;
	}
	return dptp_tcpstore_client_wait(c->c, keys, 1, r->opts->c10d.close, NULL) == 0;
}

static void closed_mark(struct rendezvous *r)
{
	struct rdzv_c10d *c = r->c10d;
	char kb[1][280];
	static const char *const names[] = {"closed"};
	const char *keys[1] = {kb[0]};
	int64_t one = 1;
	hb_keys(c, names, kb, 1);
	dptp_tcpstore_client_add_many(c->c, keys, &one, 1, NULL, NULL);
}

static void c10d_shutdown(struct rendezvous *r)
{
	struct rdzv_c10d *c = r->c10d;
	if (c && c->c && !r->quick) {
		struct dptp_err err = {0};
		bool closer = false;
		c->heartbeats = false;
		if (!closed_by_another(r, &closer) && run_op(r, op_close, dptp_now() + r->opts->c10d.close, "closing", &err) < 0)
			fprintf(stderr, "dptp-run: warning: the rendezvous could not be closed: %s\n", err.msg);
		else if (closer)
			closed_mark(r);
	}
	if (c && c->stats) {
		struct rusage ru;
		getrusage(RUSAGE_SELF, &ru);
		fprintf(stderr, "dptp-run: rdzv stats: cas=%llu cas_lost=%llu get=%llu pauses=%llu sent=%llu recv=%llu "
			"codec_s=%.3f join_s=%.3f cpu_s=%.3f state_nodes=%u folds=%llu beats=%llu batches=%llu ticket=%lld "
			"results=%llu by_result=%d fallback=%d passed=%llu\n", c->n_cas, c->n_cas_lost, c->n_get, c->n_pause,
			c->b_sent, c->b_recv, c->t_codec, c->t_join,
			(double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
			c->st->npart, c->n_folds, c->n_beats, c->n_batches, c->ticket, c->n_results, c->res_world > 0, c->fallback, c->n_passed);
	}
	if (c) {
		dptp_tcpstore_client_destroy(c->c);
		rdzv_common_store_stats(c->wserver);
		dptp_tcpstore_server_destroy(c->wserver);
		free(c->token);
		free(c->hb_last);
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
	const char *st = getenv("DPTP_RDZV_STATS");
	c->stats = st && *st && strcmp(st, "0");
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
