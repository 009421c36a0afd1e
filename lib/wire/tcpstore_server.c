/* TCPStore server: one poll(2) loop, one flat namespace, many clients.
 * Frames are cut by dptp_tcpstore_scan_request() before they are decoded, so
 * the decoder below never reads past a frame. */
#include "wire/tcpstore.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK (64u * 1024u)
#define READS_PER_STEP 16
#define ACCEPTS_PER_STEP 512

/* ---- memory accounting -------------------------------------------------------
 * The budget counts what the heap really holds: every allocation at glibc's
 * chunk size (the request plus an 8-byte header, rounded up to 16, at least
 * 32 bytes), a stored key with its struct entry and its share of the hash
 * table, a queue item with its header, a connection with its poll slot.
 * Each is charged to the peer that made it (struct peer below). */

static size_t heap_cost(size_t n)
{
	size_t c = (n + 8 + 15) & ~(size_t)15;
	return c < 32 ? 32 : c;
}

/* A peer: this host's own user (trusted), another user of this host (by
 * uid), or a remote host (by IPv4 address or IPv6 /64). Its connections
 * share one account, so opening many connections buys no more memory. */
struct peer {
	uint8_t addr[16];   /* IPv4 as ::ffff:a.b.c.d; IPv6 /64; zero for a local uid */
	uint32_t uid;       /* local peers */
	bool local, trusted;
	bool logged;        /* its refusal was logged */
	size_t held;        /* bytes charged: connections, buffers, stored entries */
};

/* ---- hash map of byte-string keys ------------------------------------------ */

struct qitem {
	struct qitem *next;
	struct peer *owner; /* charged heap_cost(sizeof(struct qitem) + len) */
	size_t len;
	uint8_t data[];
};

struct entry {
	struct entry *next;
	uint64_t hash;
	uint8_t *key;
	size_t klen;
	uint8_t *val;       /* kv map */
	size_t vlen;
	struct peer *owner; /* kv and queue maps: charged `cost` */
	size_t cost;
	struct qitem *qhead, *qtail; /* queue map */
	size_t qlen;
	struct conn *wfirst, *wlast; /* waiter index: waiters whose next missing key this is */
};

/* An entry's own cost: the struct, its key and two bucket pointers (the
 * table has between one and two per entry; a third while it doubles). */
static size_t entry_cost(size_t klen)
{
	return heap_cost(sizeof(struct entry)) + heap_cost(klen) + 2 * sizeof(struct entry *);
}

struct map {
	struct entry **b;
	size_t nb;
	size_t n;
};

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return h;
}

static struct entry *map_find(const struct map *m, const uint8_t *k, size_t kl)
{
	if (!m->nb)
		return NULL;
	uint64_t h = hash_bytes(k, kl);
	for (struct entry *e = m->b[h & (m->nb - 1)]; e; e = e->next)
		if (e->hash == h && e->klen == kl && memcmp(e->key, k, kl) == 0)
			return e;
	return NULL;
}

static int map_grow(struct map *m)
{
	size_t nb = m->nb ? m->nb * 2 : 64;
	struct entry **b = calloc(nb, sizeof(*b));
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < m->nb; i++) {
		struct entry *e = m->b[i];
		while (e) {
			struct entry *next = e->next;
			e->next = b[e->hash & (nb - 1)];
			b[e->hash & (nb - 1)] = e;
			e = next;
		}
	}
	free(m->b);
	m->b = b;
	m->nb = nb;
	return 0;
}

/* Finds or creates (with an empty value). NULL when out of memory. */
static struct entry *map_get(struct map *m, const uint8_t *k, size_t kl)
{
	struct entry *e = map_find(m, k, kl);
	if (e)
		return e;
	if (m->n >= m->nb && map_grow(m) < 0)
		return NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->key = malloc(kl ? kl : 1);
	if (!e->key) {
		free(e);
		return NULL;
	}
	memcpy(e->key, k, kl);
	e->klen = kl;
	e->hash = hash_bytes(k, kl);
	e->next = m->b[e->hash & (m->nb - 1)];
	m->b[e->hash & (m->nb - 1)] = e;
	m->n++;
	return e;
}

static void entry_free(struct entry *e)
{
	struct qitem *q = e->qhead;
	while (q) {
		struct qitem *next = q->next;
		free(q);
		q = next;
	}
	free(e->key);
	free(e->val);
	free(e);
}

static bool map_del(struct map *m, const uint8_t *k, size_t kl)
{
	if (!m->nb)
		return false;
	uint64_t h = hash_bytes(k, kl);
	for (struct entry **pp = &m->b[h & (m->nb - 1)]; *pp; pp = &(*pp)->next) {
		struct entry *e = *pp;
		if (e->hash == h && e->klen == kl && memcmp(e->key, k, kl) == 0) {
			*pp = e->next;
			entry_free(e);
			m->n--;
			return true;
		}
	}
	return false;
}

static void map_clear(struct map *m)
{
	for (size_t i = 0; i < m->nb; i++) {
		struct entry *e = m->b[i];
		while (e) {
			struct entry *next = e->next;
			entry_free(e);
			e = next;
		}
	}
	free(m->b);
	memset(m, 0, sizeof(*m));
}

/* ---- connections ----------------------------------------------------------- */

struct conn {
	int fd;
	bool dead;
	uint8_t dialect;    /* enum dptp_tcpstore_dialect, told by the first bytes */
	bool validated;
	struct peer *peer;  /* charged for the connection and its buffers */
	uint8_t *in;
	size_t inlen, incap, need;
	uint8_t *out;
	size_t outoff, outlen, outcap;
	/* pending WAIT: a copy of the frame's key list (u64 n, n x string);
	 * charged wcost: the copy and a waiter index entry for its longest key */
	uint8_t *wait;
	size_t waitlen, wcost;
	struct conn *wprev, *wnext;
	bool waiting;
	/* in the waiter index under ikey, the first key of the list from
	 * byte woff on (wleft keys) not present when last looked */
	struct entry *ikey;
	struct conn *iprev, *inext;
	size_t woff;
	uint64_t wleft;
	size_t watchbytes;  /* legacy WATCH_KEYs: keys and list slots held for this connection */
	/* the server's bookkeeping: its place in conns, the list of
	 * connections with replies to send (outq), the dead ones (deadq) */
	size_t idx;
	uint64_t serial;    /* accept order */
	bool queued, want_out;
	struct conn *onext, *dnext;
};

struct dptp_tcpstore_server {
	int lfd;
	int wakefd;
	uint16_t port;
	size_t max_client_bytes;
	struct dptp_tcpstore_limits lim;
	struct map kv;
	struct map queues;
	struct map widx;    /* key -> waiters, see struct conn */
	struct map watches; /* legacy WATCH_KEY: key -> val holds an array of struct conn * */
	struct conn **conns;
	size_t nconns, capconns;
	/* epoll: a step costs the connections that have something to do, not
	 * all of them (thousands of agents' idle connections) */
	int epfd;
	bool lfd_on;
	uint64_t serials;
	struct conn *outq, *deadq;
	struct conn *whead, *wtail; /* waiters, in arrival order */
	double accept_pause_until;
	/* thread */
	pthread_t thread;
	bool running;
	int stop; /* __atomic */
	/* counters (__atomic) */
	size_t st_clients, st_buffered, st_keys, st_rejected, st_used;
	size_t buffered;    /* connections with their input, output and WAIT buffers */
	size_t used;        /* everything charged to a peer: the budget's measure */
	size_t untrusted;   /* the part of used charged to untrusted peers */
	size_t max_total;   /* budget for used */
	size_t fd_share;    /* max_total / RLIMIT_NOFILE: see conn_cost() */
	struct peer **peers;
	size_t npeers, cappeers;
	int diag;           /* sock_diag: 1 works, 0 absent, -1 not tried yet */
	int nlfd;           /* its socket, -1 until needed */
	uint32_t nlseq;
	unsigned nlogged;   /* refusal lines written */
	void (*log)(void *arg, const char *msg);
	void *log_arg;
	/* operations, request and reply bytes per opcode, compare-sets that
	 * did not write, peak connections, loop steps (server_stats) */
	uint64_t op_n[DPTP_TCPSTORE_WATCH_KEY + 1], op_in[DPTP_TCPSTORE_WATCH_KEY + 1],
		op_out[DPTP_TCPSTORE_WATCH_KEY + 1];
	uint64_t cas_missed, steps, accepted;
	size_t peak_conns;
	unsigned long long fd_pauses; /* accepts held back by fds_short() */
};

/* What a peer other than this host's own user may hold: an eighth of the
 * budget each, half of it for all of them together. The job's own
 * processes on this host keep the other half whatever outsiders send. */
static size_t peer_share(const struct dptp_tcpstore_server *s)
{
	return s->max_total / 8;
}

static size_t untrusted_share(const struct dptp_tcpstore_server *s)
{
	return s->max_total / 2;
}

static void peer_name(const struct peer *p, char *buf, size_t len)
{
	if (p->local) {
		snprintf(buf, len, "uid %u on this host", (unsigned)p->uid);
		return;
	}
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	char a[INET6_ADDRSTRLEN] = "?";
	if (memcmp(p->addr, v4, 12) == 0) {
		inet_ntop(AF_INET, p->addr + 12, a, sizeof(a));
		snprintf(buf, len, "%s", a);
	} else {
		inet_ntop(AF_INET6, p->addr, a, sizeof(a));
		snprintf(buf, len, "%s/64", a);
	}
}

/* Would charging `more` bytes to p pass the budget or p's share? Refusals
 * are logged once per peer, at most 8 lines in all. */
static bool over_budget(struct dptp_tcpstore_server *s, struct peer *p, size_t more, const char *what)
{
	const char *why = NULL;
	if (s->used + more > s->max_total)
		why = "memory budget";
	else if (!p->trusted && p->held + more > peer_share(s))
		why = "share of one peer (an eighth of the budget)";
	else if (!p->trusted && s->untrusted + more > untrusted_share(s))
		why = "share of all peers other than this host's user (half the budget)";
	if (!why)
		return false;
	if (!p->logged && s->nlogged < 8 && s->log) {
		char msg[384], who[80];
		peer_name(p, who, sizeof(who));
		snprintf(msg, sizeof(msg), "store: %s of %zu MiB reached (%zu MiB buffered, %zu MiB stored, %zu MiB "
			 "held by %s): refusing %s from %s and closing its connection (DPTP_STORE_MAX_BYTES sets the budget)",
			 why, s->max_total >> 20, s->buffered >> 20, (s->used - s->buffered) >> 20, p->held >> 20,
			 who, what, who);
		s->log(s->log_arg, msg);
		s->nlogged++;
	}
	p->logged = true;
	return true;
}

static void charge(struct dptp_tcpstore_server *s, struct peer *p, size_t n)
{
	p->held += n;
	s->used += n;
	if (!p->trusted)
		s->untrusted += n;
}

/* Gives back n bytes of p's; a peer that holds nothing is forgotten. */
static void release(struct dptp_tcpstore_server *s, struct peer *p, size_t n)
{
	p->held -= n;
	s->used -= n;
	if (!p->trusted)
		s->untrusted -= n;
	if (p->held)
		return;
	for (size_t i = 0; i < s->npeers; i++)
		if (s->peers[i] == p) {
			s->peers[i] = s->peers[--s->npeers];
			break;
		}
	free(p);
}

/* Charges p for `cost` more bytes if the budget allows. */
static bool take(struct dptp_tcpstore_server *s, struct peer *p, size_t cost, const char *what)
{
	if (over_budget(s, p, cost, what))
		return false;
	charge(s, p, cost);
	return true;
}

/* Would moving an object charged `cost` to `owner` over to p, at newcost,
 * pass the budget? (A write charges the writer for what it leaves.) */
static bool recharge_refused(struct dptp_tcpstore_server *s, const struct peer *owner, size_t cost,
			     struct peer *p, size_t newcost, const char *what)
{
	size_t credit = owner == p ? cost : 0;
	return newcost > credit && over_budget(s, p, newcost - credit, what);
}

static void recharge(struct dptp_tcpstore_server *s, struct peer **owner, size_t *cost, struct peer *p,
		     size_t newcost)
{
	charge(s, p, newcost);
	if (*owner)
		release(s, *owner, *cost);
	*owner = p;
	*cost = newcost;
}

static void stat_set(size_t *p, size_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static size_t stat_get(const size_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static size_t conn_bytes(const struct conn *c)
{
	return c->incap + c->outcap + c->wcost + c->watchbytes;
}

/* What a connection costs before any buffer: its struct and poll slot;
 * for a peer other than this host's user at least its part of the
 * descriptors (the budget over RLIMIT_NOFILE), so that outsiders' idle
 * connections hold at most half of this process's descriptors too. */
static size_t conn_cost(const struct dptp_tcpstore_server *s, const struct peer *p)
{
	size_t c = heap_cost(sizeof(struct conn)) + sizeof(struct epoll_event) + 2 * sizeof(struct conn *);
	return !p->trusted && s->fd_share > c ? s->fd_share : c;
}

/* Charges c's peer for n more bytes of c's buffers, if the budget allows. */
static bool buf_take(struct dptp_tcpstore_server *s, struct conn *c, size_t n, const char *what)
{
	if (!take(s, c->peer, n, what))
		return false;
	s->buffered += n;
	return true;
}

static void buf_release(struct dptp_tcpstore_server *s, struct conn *c, size_t n)
{
	s->buffered -= n;
	release(s, c->peer, n);
}

static void index_remove(struct dptp_tcpstore_server *s, struct conn *c)
{
	struct entry *e = c->ikey;
	if (!e)
		return;
	if (c->iprev)
		c->iprev->inext = c->inext;
	else
		e->wfirst = c->inext;
	if (c->inext)
		c->inext->iprev = c->iprev;
	else
		e->wlast = c->iprev;
	c->iprev = c->inext = NULL;
	c->ikey = NULL;
	if (!e->wfirst)
		map_del(&s->widx, e->key, e->klen);
}

static void waiter_unlink(struct dptp_tcpstore_server *s, struct conn *c)
{
	if (!c->waiting)
		return;
	index_remove(s, c);
	if (c->wprev)
		c->wprev->wnext = c->wnext;
	else
		s->whead = c->wnext;
	if (c->wnext)
		c->wnext->wprev = c->wprev;
	else
		s->wtail = c->wprev;
	c->wprev = c->wnext = NULL;
	c->waiting = false;
	buf_release(s, c, c->wcost);
	free(c->wait);
	c->wait = NULL;
	c->waitlen = c->wcost = 0;
}

static void conn_kill(struct dptp_tcpstore_server *s, struct conn *c, bool rejected)
{
	if (c->dead)
		return;
	c->dead = true;
	c->dnext = s->deadq;
	s->deadq = c;
	waiter_unlink(s, c);
	if (rejected)
		stat_set(&s->st_rejected, stat_get(&s->st_rejected) + 1);
}

static void unwatch(struct dptp_tcpstore_server *s, struct conn *c);

static void conn_free(struct dptp_tcpstore_server *s, struct conn *c)
{
	waiter_unlink(s, c);
	unwatch(s, c);
	buf_release(s, c, c->incap + c->outcap + conn_cost(s, c->peer)); /* may forget the peer */
	/* out of the epoll set before close(): close() takes it out only
	 * when no other descriptor shares the open file, and a child between
	 * its (v)fork and exec still holds one (a worker's spawn): epoll
	 * went on reporting the freed conn (ASan: a use after free in
	 * dptp_tcpstore_server_step) */
	if (c->fd >= 0) {
		epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	free(c->in);
	free(c->out);
	free(c);
}

/* Reserves n more output bytes; kills the connection past the limit. */
static uint8_t *out_reserve(struct dptp_tcpstore_server *s, struct conn *c, size_t n)
{
	if (c->dead)
		return NULL;
	if (c->outoff && c->outoff == c->outlen)
		c->outoff = c->outlen = 0;
	if (c->outlen + n > c->outcap) {
		if (c->outoff) {
			memmove(c->out, c->out + c->outoff, c->outlen - c->outoff);
			c->outlen -= c->outoff;
			c->outoff = 0;
		}
	}
	if (c->outlen + n > c->outcap) {
		size_t cap = c->outcap ? c->outcap : 256;
		while (cap < c->outlen + n)
			cap *= 2;
		if (cap - c->outcap + conn_bytes(c) > s->max_client_bytes ||
		    !buf_take(s, c, cap - c->outcap, "a reply")) {
			/* the client does not read its replies, or asked for too much */
			conn_kill(s, c, true);
			return NULL;
		}
		uint8_t *no = realloc(c->out, cap);
		if (!no) {
			buf_release(s, c, cap - c->outcap);
			conn_kill(s, c, true);
			return NULL;
		}
		c->out = no;
		c->outcap = cap;
	}
	uint8_t *p = c->out + c->outlen;
	c->outlen += n;
	if (!c->queued) {
		c->queued = true;
		c->onext = s->outq;
		s->outq = c;
	}
	return p;
}

static void out_bytes(struct dptp_tcpstore_server *s, struct conn *c, const void *p, size_t n)
{
	uint8_t *d = out_reserve(s, c, n);
	if (d && n)
		memcpy(d, p, n);
}

static void out_u8(struct dptp_tcpstore_server *s, struct conn *c, uint8_t v)
{
	out_bytes(s, c, &v, 1);
}

static void out_u64(struct dptp_tcpstore_server *s, struct conn *c, uint64_t v)
{
	uint8_t b[8];
	dptp_le64_put(b, v);
	out_bytes(s, c, b, 8);
}

static void out_str(struct dptp_tcpstore_server *s, struct conn *c, const void *p, size_t n)
{
	out_u64(s, c, n);
	out_bytes(s, c, p, n);
}

/* ---- frame decoding (the frame is known complete and within limits) --------- */

struct rd {
	const uint8_t *p;
	size_t off;
};

static uint64_t rd_u64(struct rd *r)
{
	uint64_t v = dptp_le64_get(r->p + r->off);
	r->off += 8;
	return v;
}

static const uint8_t *rd_str(struct rd *r, size_t *len)
{
	*len = (size_t)rd_u64(r);
	const uint8_t *p = r->p + r->off;
	r->off += *len;
	return p;
}

/* ---- store semantics ----------------------------------------------------------- */

static bool key_present(const struct dptp_tcpstore_server *s, const uint8_t *k, size_t kl)
{
	if (map_find(&s->kv, k, kl))
		return true;
	const struct entry *q = map_find(&s->queues, k, kl);
	return q && q->qlen > 0;
}

/* Walks a key list (u64 n, n x string): all present? */
static bool keys_present(const struct dptp_tcpstore_server *s, const uint8_t *list)
{
	struct rd r = {.p = list};
	uint64_t n = rd_u64(&r);
	for (uint64_t i = 0; i < n; i++) {
		size_t kl;
		const uint8_t *k = rd_str(&r, &kl);
		if (!key_present(s, k, kl))
			return false;
	}
	return true;
}

static void wake(struct dptp_tcpstore_server *s, struct conn *c)
{
	waiter_unlink(s, c);
	out_u8(s, c, DPTP_TCPSTORE_STOP_WAITING);
}

/* Moves c's cursor past the keys now present and files it under the first
 * missing one. false when every key is present (c is then in no list). */
static bool index_file(struct dptp_tcpstore_server *s, struct conn *c)
{
	index_remove(s, c);
	struct rd r = {.p = c->wait, .off = c->woff};
	for (int pass = 0; pass < 2; pass++) {
		while (c->wleft) {
			size_t at = r.off, kl;
			const uint8_t *k = rd_str(&r, &kl);
			if (!key_present(s, k, kl)) {
				struct entry *e = map_get(&s->widx, k, kl);
				if (!e)
					return true; /* out of memory: stays unfiled, answered on no write */
				c->woff = at;
				c->ikey = e;
				c->iprev = e->wlast;
				if (e->wlast)
					e->wlast->inext = c;
				else
					e->wfirst = c;
				e->wlast = c;
				return true;
			}
			c->wleft--;
		}
		/* every key was present when passed; a DELETE or QUEUE_POP may
		 * have removed one since: look again from the start once */
		if (keys_present(s, c->wait))
			return false;
		r = (struct rd){.p = c->wait};
		c->wleft = rd_u64(&r);
	}
	return true;
}

/* After a write of key k: the waiters filed under k move on to their next
 * missing key, or are answered (all of them, or with one_only the oldest:
 * a queue push feeds one blocked pop). Costs the waiters of k, not all. */
static void wake_key(struct dptp_tcpstore_server *s, const uint8_t *k, size_t kl, bool one_only)
{
	struct entry *e = map_find(&s->widx, k, kl);
	bool woke = false;
	struct conn *c = e ? e->wfirst : NULL;
	while (c) {
		struct conn *next = c->inext;
		if (one_only && woke)
			break; /* the rest stay filed under k for the next push */
		if (!index_file(s, c)) {
			wake(s, c);
			woke = true;
		}
		c = next;
	}
}

/* A stored key with a value of vl bytes. */
static size_t kv_cost(size_t kl, size_t vl)
{
	return entry_cost(kl) + heap_cost(vl ? vl : 1);
}

/* Sets k to the vl bytes at v (v may be e's own value: APPEND passes NULL
 * and appends instead). The writer's peer is charged for the whole key. */
static int kv_write(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *k, size_t kl,
		    const uint8_t *v, size_t vl, bool append, const char *what)
{
	struct entry *e = map_find(&s->kv, k, kl);
	bool fresh = !e;
	size_t nl = append && e ? e->vlen + vl : vl, cost = kv_cost(kl, nl);
	if (recharge_refused(s, e ? e->owner : NULL, e ? e->cost : 0, c->peer, cost, what))
		return -ENOSPC;
	if (fresh && !(e = map_get(&s->kv, k, kl)))
		return -ENOMEM;
	uint8_t *nv = malloc(nl ? nl : 1);
	if (!nv) {
		if (fresh)
			map_del(&s->kv, k, kl);
		return -ENOMEM;
	}
	size_t at = nl - vl;
	if (at)
		memcpy(nv, e->val, at);
	memcpy(nv + at, v, vl);
	free(e->val);
	e->val = nv;
	e->vlen = nl;
	recharge(s, &e->owner, &e->cost, c->peer, cost);
	return 0;
}

static int kv_set(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *k, size_t kl,
		  const uint8_t *v, size_t vl)
{
	return kv_write(s, c, k, kl, v, vl, false, "a write");
}

/* Parses a stored ADD value like std::stoll: optional blanks, sign, digits. */
static int parse_i64(const uint8_t *p, size_t n, int64_t *out)
{
	char buf[32];
	if (n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, p, n);
	buf[n] = 0;
	char *end = NULL;
	errno = 0;
	long long v = strtoll(buf, &end, 10);
	if (end == buf || errno == ERANGE)
		return -EINVAL;
	*out = v;
	return 0;
}

static int cmp_keys(const void *a, const void *b)
{
	const struct entry *x = *(const struct entry *const *)a;
	const struct entry *y = *(const struct entry *const *)b;
	size_t n = x->klen < y->klen ? x->klen : y->klen;
	int r = memcmp(x->key, y->key, n);
	if (r)
		return r;
	return x->klen < y->klen ? -1 : x->klen > y->klen;
}

/* ---- legacy watches (torch 1.13 - 2.0 callback connections) ------------------ */

/* c watches key k: it gets a message on every change of k until it leaves. */
static int watch_add(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *k, size_t kl)
{
	/* a list slot, and the key's entry when it is the first watcher */
	size_t cost = entry_cost(kl) + sizeof(c);
	if (conn_bytes(c) + cost > s->max_client_bytes || !buf_take(s, c, cost, "a WATCH_KEY"))
		return -ENOBUFS;
	struct entry *w = map_get(&s->watches, k, kl);
	struct conn **v = w ? realloc(w->val, w->vlen + sizeof(c)) : NULL;
	if (!v) {
		if (w && !w->vlen)
			map_del(&s->watches, k, kl);
		buf_release(s, c, cost);
		return -ENOMEM;
	}
	v[w->vlen / sizeof(c)] = c;
	w->val = (uint8_t *)v;
	w->vlen += sizeof(c);
	c->watchbytes += cost;
	out_u8(s, c, DPTP_TCPSTORE_KEY_CALLBACK_REGISTERED);
	return 0;
}

/* Takes c out of every watch list (it is going away). */
static void unwatch(struct dptp_tcpstore_server *s, struct conn *c)
{
	if (!c->watchbytes)
		return;
	for (size_t i = 0; i < s->watches.nb; i++) {
		struct entry **pp = &s->watches.b[i];
		while (*pp) {
			struct entry *w = *pp;
			struct conn **v = (struct conn **)w->val;
			size_t n = w->vlen / sizeof(c), j = 0;
			for (size_t i2 = 0; i2 < n; i2++)
				if (v[i2] != c)
					v[j++] = v[i2];
			w->vlen = j * sizeof(c);
			if (j) {
				pp = &w->next;
				continue;
			}
			*pp = w->next;
			entry_free(w);
			s->watches.n--;
		}
	}
	buf_release(s, c, c->watchbytes);
	c->watchbytes = 0;
}

static void watch_send(struct dptp_tcpstore_server *s, const struct entry *w, uint8_t type,
		       const uint8_t *old, size_t ol, const uint8_t *nv, size_t nl)
{
	struct conn *const *v = (struct conn *const *)w->val;
	for (size_t i = 0; i < w->vlen / sizeof(*v); i++) {
		struct conn *c = v[i];
		out_u8(s, c, type);
		out_str(s, c, w->key, w->klen);
		out_str(s, c, old, ol);
		out_str(s, c, nv, nl);
	}
}

/* A write of one key as its watchers see it: change_begin() before it keeps
 * the old value (only when the key is watched), change_end() after it sends
 * CREATED, UPDATED or DELETED from the key's state then. */
struct change {
	const struct entry *w;
	bool existed;
	uint8_t *old;
	size_t ol;
};

static int change_begin(struct dptp_tcpstore_server *s, const uint8_t *k, size_t kl, struct change *ch)
{
	*ch = (struct change){0};
	if (!s->watches.n || !(ch->w = map_find(&s->watches, k, kl)))
		return 0;
	const struct entry *e = map_find(&s->kv, k, kl);
	if (!e)
		return 0;
	ch->old = malloc(e->vlen ? e->vlen : 1);
	if (!ch->old)
		return -ENOMEM;
	memcpy(ch->old, e->val, e->vlen);
	ch->ol = e->vlen;
	ch->existed = true;
	return 0;
}

static void change_end(struct dptp_tcpstore_server *s, struct change *ch, bool changed)
{
	if (ch->w && changed) {
		const struct entry *e = map_find(&s->kv, ch->w->key, ch->w->klen);
		if (e)
			watch_send(s, ch->w, ch->existed ? DPTP_TCPSTORE_KEY_UPDATED : DPTP_TCPSTORE_KEY_CREATED,
				   ch->old, ch->ol, e->val, e->vlen);
		else if (ch->existed)
			watch_send(s, ch->w, DPTP_TCPSTORE_KEY_DELETED, ch->old, ch->ol, NULL, 0);
	}
	free(ch->old);
	ch->old = NULL;
}

/* SET with its watchers told. */
static int set_watched(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *k, size_t kl,
		       const uint8_t *v, size_t vl)
{
	struct change ch;
	DPTP_TRY(change_begin(s, k, kl, &ch));
	int rc = kv_set(s, c, k, kl, v, vl);
	change_end(s, &ch, rc == 0);
	return rc;
}

/* ---- one function per opcode -------------------------------------------------
 * Each answers one complete frame f of flen bytes (f[0] is the opcode byte
 * as the wire has it) on a validated connection. Returns 0, or <0 to close
 * the connection. */

/* The frame's first string, after its opcode: the key of most queries. */
static const uint8_t *frame_key(const uint8_t *f, size_t *kl)
{
	struct rd r = {.p = f, .off = 1};
	return rd_str(&r, kl);
}

/* A frame of a key and a value (SET, APPEND, QUEUE_PUSH). */
static void frame_kv(const uint8_t *f, const uint8_t **k, size_t *kl, const uint8_t **v, size_t *vl)
{
	struct rd r = {.p = f, .off = 1};
	*k = rd_str(&r, kl);
	*v = rd_str(&r, vl);
}

static int op_ping(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	out_bytes(s, c, f + 1, 4);
	return 0;
}

static int op_set(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl, vl;
	const uint8_t *k, *v;
	frame_kv(f, &k, &kl, &v, &vl);
	DPTP_TRY(set_watched(s, c, k, kl, v, vl));
	wake_key(s, k, kl, false);
	return 0;
}

static int op_watch_key(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl;
	const uint8_t *k = frame_key(f, &kl);
	return watch_add(s, c, k, kl);
}

static int op_compare_set(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	struct rd r = {.p = f, .off = 1};
	size_t kl, el, vl;
	const uint8_t *k = rd_str(&r, &kl);
	const uint8_t *ev = rd_str(&r, &el);
	const uint8_t *v = rd_str(&r, &vl);
	struct entry *e = map_find(&s->kv, k, kl);
	if (!e) {
		if (el == 0) {
			DPTP_TRY(set_watched(s, c, k, kl, v, vl));
			out_str(s, c, v, vl);
		} else {
			out_str(s, c, ev, el);
		}
	} else {
		if (e->vlen == el && memcmp(e->val, ev, el) == 0)
			DPTP_TRY(set_watched(s, c, k, kl, v, vl));
		else
			s->cas_missed++;
		out_str(s, c, e->val, e->vlen);
	}
	wake_key(s, k, kl, false);
	return 0;
}

static int op_get(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl;
	const uint8_t *k = frame_key(f, &kl);
	struct entry *e = map_find(&s->kv, k, kl);
	out_str(s, c, e ? e->val : NULL, e ? e->vlen : 0);
	return 0;
}

static int op_add(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	struct rd r = {.p = f, .off = 1};
	size_t kl;
	const uint8_t *k = rd_str(&r, &kl);
	int64_t delta = (int64_t)rd_u64(&r), old = 0, sum;
	struct entry *e = map_find(&s->kv, k, kl);
	if (e && parse_i64(e->val, e->vlen, &old) < 0)
		return -EINVAL; /* torch's stoll throws and the client is dropped */
	if (__builtin_add_overflow(old, delta, &sum))
		return -ERANGE;
	char num[24];
	int nl = snprintf(num, sizeof(num), "%" PRId64, sum);
	DPTP_TRY(set_watched(s, c, k, kl, (const uint8_t *)num, (size_t)nl));
	out_u64(s, c, (uint64_t)sum);
	wake_key(s, k, kl, false);
	return 0;
}

static int op_check(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	out_u8(s, c, keys_present(s, f + 1) ? DPTP_TCPSTORE_READY : DPTP_TCPSTORE_NOT_READY);
	return 0;
}

/* Keeps a copy of the key list (list, n bytes), files c under its first
 * missing key and queues c last among the waiters. */
static int wait_begin(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *list, size_t n)
{
	/* the copy, and the waiter index entry of its longest key */
	size_t cost = heap_cost(n) + entry_cost(n);
	if (conn_bytes(c) + cost > s->max_client_bytes || !buf_take(s, c, cost, "a WAIT"))
		return -ENOBUFS;
	c->wait = malloc(n);
	if (!c->wait) {
		buf_release(s, c, cost);
		return -ENOMEM;
	}
	memcpy(c->wait, list, n);
	c->waitlen = n;
	c->wcost = cost;
	c->waiting = true;
	struct rd wr = {.p = c->wait};
	c->wleft = rd_u64(&wr);
	c->woff = wr.off;
	index_file(s, c); /* some key is missing: filed under the first */
	c->wprev = s->wtail;
	c->wnext = NULL;
	if (s->wtail)
		s->wtail->wnext = c;
	else
		s->whead = c;
	s->wtail = c;
	return 0;
}

static int op_wait(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	waiter_unlink(s, c); /* a new WAIT replaces an unanswered one */
	if (keys_present(s, f + 1)) {
		out_u8(s, c, DPTP_TCPSTORE_STOP_WAITING);
		return 0;
	}
	return wait_begin(s, c, f + 1, flen - 1);
}

static int op_getnumkeys(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	out_u64(s, c, (uint64_t)s->kv.n);
	return 0;
}

static int op_delete_key(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl;
	const uint8_t *k = frame_key(f, &kl);
	struct change ch;
	DPTP_TRY(change_begin(s, k, kl, &ch));
	struct entry *d = map_find(&s->kv, k, kl);
	if (d)
		release(s, d->owner, d->cost);
	bool gone = map_del(&s->kv, k, kl);
	change_end(s, &ch, gone);
	out_u64(s, c, gone ? 1 : 0);
	return 0;
}

static int op_append(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl, vl;
	const uint8_t *k, *v;
	frame_kv(f, &k, &kl, &v, &vl);
	struct entry *e = map_find(&s->kv, k, kl);
	const struct entry *w = s->watches.n ? map_find(&s->watches, k, kl) : NULL;
	if (e && e->vlen + vl > 4 * (size_t)s->lim.max_value)
		return -EMSGSIZE; /* keep appends from growing a value without bound */
	bool existed = e != NULL;
	DPTP_TRY(kv_write(s, c, k, kl, v, vl, true, "an APPEND"));
	if (w) /* as torch 2.1's nightlies did: the appended bytes only */
		watch_send(s, w, existed ? DPTP_TCPSTORE_KEY_APPENDED : DPTP_TCPSTORE_KEY_CREATED, NULL, 0, v, vl);
	wake_key(s, k, kl, false);
	return 0;
}

static int op_multi_get(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	struct rd r = {.p = f, .off = 1};
	uint64_t n = rd_u64(&r);
	for (uint64_t i = 0; i < n && !c->dead; i++) {
		size_t kl;
		const uint8_t *k = rd_str(&r, &kl);
		struct entry *e = map_find(&s->kv, k, kl);
		out_str(s, c, e ? e->val : NULL, e ? e->vlen : 0);
	}
	return 0;
}

static int op_multi_set(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	struct rd r = {.p = f, .off = 1};
	uint64_t n = rd_u64(&r);
	for (uint64_t i = 0; i < n; i++) {
		size_t kl, vl;
		const uint8_t *k = rd_str(&r, &kl);
		const uint8_t *v = rd_str(&r, &vl);
		DPTP_TRY(set_watched(s, c, k, kl, v, vl));
		wake_key(s, k, kl, false);
	}
	return 0;
}

static int op_cancel_wait(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	waiter_unlink(s, c);
	out_u8(s, c, DPTP_TCPSTORE_WAIT_CANCELED);
	return 0;
}

static int op_queue_push(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl, vl;
	const uint8_t *k, *v;
	frame_kv(f, &k, &kl, &v, &vl);
	/* the item, and the queue's own entry when it is new */
	struct entry *q = map_find(&s->queues, k, kl);
	size_t icost = heap_cost(sizeof(struct qitem) + vl), qcost = q ? 0 : entry_cost(kl);
	if (over_budget(s, c->peer, icost + qcost, "a QUEUE_PUSH"))
		return -ENOSPC;
	if (!q && !(q = map_get(&s->queues, k, kl)))
		return -ENOMEM;
	struct qitem *it = malloc(sizeof(*it) + vl);
	if (!it) {
		if (!q->qlen)
			map_del(&s->queues, k, kl);
		return -ENOMEM;
	}
	if (qcost)
		recharge(s, &q->owner, &q->cost, c->peer, qcost);
	charge(s, c->peer, icost);
	it->owner = c->peer;
	it->next = NULL;
	it->len = vl;
	memcpy(it->data, v, vl);
	if (q->qtail)
		q->qtail->next = it;
	else
		q->qhead = it;
	q->qtail = it;
	q->qlen++;
	wake_key(s, k, kl, true);
	return 0;
}

static int op_queue_pop(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl;
	const uint8_t *k = frame_key(f, &kl);
	struct entry *q = map_find(&s->queues, k, kl);
	if (!q || !q->qlen) {
		out_u64(s, c, 0);
		return 0;
	}
	out_u64(s, c, q->qlen); /* torch replies the length before the pop */
	struct qitem *it = q->qhead;
	out_str(s, c, it->data, it->len);
	q->qhead = it->next;
	if (!q->qhead)
		q->qtail = NULL;
	q->qlen--;
	release(s, it->owner, heap_cost(sizeof(*it) + it->len));
	free(it);
	if (!q->qlen) {
		release(s, q->owner, q->cost);
		map_del(&s->queues, k, kl);
	}
	return 0;
}

static int op_queue_len(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	size_t kl;
	const uint8_t *k = frame_key(f, &kl);
	struct entry *q = map_find(&s->queues, k, kl);
	out_u64(s, c, q ? q->qlen : 0);
	return 0;
}

static int op_list_keys(struct dptp_tcpstore_server *s, struct conn *c, const uint8_t *f, size_t flen)
{
	struct entry **all = malloc((s->kv.n ? s->kv.n : 1) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < s->kv.nb; i++)
		for (struct entry *e = s->kv.b[i]; e; e = e->next)
			all[n++] = e;
	qsort(all, n, sizeof(*all), cmp_keys);
	out_u64(s, c, n);
	for (size_t i = 0; i < n && !c->dead; i++)
		out_str(s, c, all[i]->key, all[i]->klen);
	free(all);
	return 0;
}

/* The opcodes a validated connection may send, in the current numbering
 * (WATCH_KEY, legacy only, just past it). VALIDATE has no entry: sent
 * again it closes the connection, as an opcode out of the table does. */
static int (*const op_handlers[DPTP_TCPSTORE_WATCH_KEY + 1])(struct dptp_tcpstore_server *s, struct conn *c,
							   const uint8_t *f, size_t flen) = {
	[DPTP_TCPSTORE_SET] = op_set,
	[DPTP_TCPSTORE_COMPARE_SET] = op_compare_set,
	[DPTP_TCPSTORE_GET] = op_get,
	[DPTP_TCPSTORE_ADD] = op_add,
	[DPTP_TCPSTORE_CHECK] = op_check,
	[DPTP_TCPSTORE_WAIT] = op_wait,
	[DPTP_TCPSTORE_GETNUMKEYS] = op_getnumkeys,
	[DPTP_TCPSTORE_DELETE_KEY] = op_delete_key,
	[DPTP_TCPSTORE_APPEND] = op_append,
	[DPTP_TCPSTORE_MULTI_GET] = op_multi_get,
	[DPTP_TCPSTORE_MULTI_SET] = op_multi_set,
	[DPTP_TCPSTORE_CANCEL_WAIT] = op_cancel_wait,
	[DPTP_TCPSTORE_PING] = op_ping,
	[DPTP_TCPSTORE_QUEUE_PUSH] = op_queue_push,
	[DPTP_TCPSTORE_QUEUE_POP] = op_queue_pop,
	[DPTP_TCPSTORE_QUEUE_LEN] = op_queue_len,
	[DPTP_TCPSTORE_LIST_KEYS] = op_list_keys,
	[DPTP_TCPSTORE_WATCH_KEY] = op_watch_key,
};

/* Handles one complete frame whose opcode, in the current numbering, is op
 * (the wire's byte at f[0] may be a legacy one). Returns 0, or <0 to close
 * the connection. */
static int handle(struct dptp_tcpstore_server *s, struct conn *c, int op, const uint8_t *f, size_t flen)
{
	if (!c->validated) {
		if (op != DPTP_TCPSTORE_VALIDATE)
			return -EPROTO; /* torch's libuv server accepts only VALIDATE first */
		c->validated = true; /* the scanner checked the magic */
		return 0;
	}
	if (op < 0 || (size_t)op >= DPTP_ARRAY_LEN(op_handlers) || !op_handlers[op])
		return -EPROTO; /* VALIDATE again, or an opcode the scanner let through */
	size_t before = c->outlen - c->outoff;
	int rc = op_handlers[op](s, c, f, flen);
	s->op_n[op]++;
	s->op_in[op] += flen;
	s->op_out[op] += c->outlen - c->outoff >= before ? c->outlen - c->outoff - before : 0;
	return rc;
}

/* Cuts and handles every complete frame in c->in. */
static void process_input(struct dptp_tcpstore_server *s, struct conn *c)
{
	size_t off = 0;
	while (!c->dead && c->inlen - off >= c->need && c->inlen > off) {
		if (c->dialect == DPTP_TCPSTORE_DIALECT_UNKNOWN) {
			c->dialect = dptp_tcpstore_dialect_of(c->in + off, c->inlen - off);
			if (c->dialect == DPTP_TCPSTORE_DIALECT_UNKNOWN) {
				c->need = 5; /* a 0 and the start of the magic: VALIDATE? */
				break;
			}
			/* torch before 2.1 validates nothing */
			c->validated = c->dialect == DPTP_TCPSTORE_DIALECT_LEGACY;
		}
		bool legacy = c->dialect == DPTP_TCPSTORE_DIALECT_LEGACY;
		size_t n = 0;
		int rc = legacy ? dptp_tcpstore_scan_legacy_request(c->in + off, c->inlen - off, &s->lim, &n)
				: dptp_tcpstore_scan_request(c->in + off, c->inlen - off, &s->lim, &n);
		if (rc < 0) {
			conn_kill(s, c, true);
			break;
		}
		if (rc == 0) {
			if (n > s->max_client_bytes) {
				conn_kill(s, c, true); /* refused before the bytes arrive */
				break;
			}
			c->need = n;
			break;
		}
		c->need = 1;
		uint8_t wire = c->in[off];
		if (handle(s, c, legacy ? dptp_tcpstore_op_from_legacy(wire) : wire, c->in + off, n) < 0) {
			conn_kill(s, c, true);
			break;
		}
		off += n;
	}
	if (off) {
		memmove(c->in, c->in + off, c->inlen - off);
		c->inlen -= off; /* need is relative to the frame start: unchanged */
	}
}

/* Gives back an empty input buffer: an idle connection costs its struct,
 * not a read chunk (8000 workers x 64 KiB would be 500 MiB). */
static void in_trim(struct dptp_tcpstore_server *s, struct conn *c)
{
	if (c->inlen == 0 && c->incap) {
		free(c->in);
		buf_release(s, c, c->incap);
		c->in = NULL;
		c->incap = 0;
	}
}

/* After a failed recv/send: true to retry (EINTR); otherwise false, having
 * closed the connection unless it only would block. */
static bool io_retry(struct dptp_tcpstore_server *s, struct conn *c)
{
	if (errno == EINTR)
		return true;
	if (errno != EAGAIN && errno != EWOULDBLOCK)
		conn_kill(s, c, false);
	return false;
}

static void conn_read(struct dptp_tcpstore_server *s, struct conn *c)
{
	for (int i = 0; i < READS_PER_STEP && !c->dead; i++) {
		/* grow with what actually arrives (doubling), never to the
		 * size a length prefix merely announces: 64 clients announcing
		 * 8 MiB values they never send must not cost 512 MiB */
		size_t want = c->inlen + READ_CHUNK;
		if (c->need > want && c->incap * 2 > want)
			want = c->incap * 2 < c->need ? c->incap * 2 : c->need;
		if (want > s->max_client_bytes)
			want = s->max_client_bytes;
		if (want > c->incap) {
			size_t grow = want - c->incap;
			if (conn_bytes(c) + grow > s->max_client_bytes) {
				want = c->incap + (s->max_client_bytes - conn_bytes(c));
				grow = want - c->incap;
			}
			if (grow && !buf_take(s, c, grow, "a client's unfinished frame")) {
				conn_kill(s, c, true);
				return;
			}
			if (grow) {
				uint8_t *ni = realloc(c->in, want);
				if (!ni) {
					buf_release(s, c, grow);
					conn_kill(s, c, true);
					return;
				}
				c->in = ni;
				c->incap = want;
			}
		}
		if (c->inlen == c->incap) {
			conn_kill(s, c, true); /* over the per-client limit */
			return;
		}
		ssize_t k = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, MSG_DONTWAIT);
		if (k == 0) {
			conn_kill(s, c, false);
			return;
		}
		if (k < 0) {
			if (io_retry(s, c))
				continue;
			break;
		}
		c->inlen += (size_t)k;
		process_input(s, c);
	}
	in_trim(s, c);
}

static void conn_write(struct dptp_tcpstore_server *s, struct conn *c)
{
	while (!c->dead && c->outoff < c->outlen) {
		ssize_t k = send(c->fd, c->out + c->outoff, c->outlen - c->outoff,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k < 0) {
			if (io_retry(s, c))
				continue;
			return;
		}
		c->outoff += (size_t)k;
	}
	if (c->outoff == c->outlen) {
		c->outoff = c->outlen = 0;
		if (c->outcap > 4 * READ_CHUNK) {
			free(c->out);
			buf_release(s, c, c->outcap);
			c->out = NULL;
			c->outcap = 0;
		}
	}
}

/* ---- peers -------------------------------------------------------------------- */

/* An address as IPv6, IPv4 mapped to ::ffff:a.b.c.d. */
static void addr_norm(const struct sockaddr_storage *ss, uint8_t a[16], uint16_t *port)
{
	memset(a, 0, 16);
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *v4 = (const void *)ss;
		a[10] = a[11] = 0xff;
		memcpy(a + 12, &v4->sin_addr, 4);
		*port = v4->sin_port;
	} else {
		const struct sockaddr_in6 *v6 = (const void *)ss;
		memcpy(a, &v6->sin6_addr, 16);
		*port = v6->sin6_port;
	}
}

static bool addr_v4(const uint8_t a[16])
{
	static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(a, pre, 12) == 0;
}

/* The uid owning the TCP socket of this network namespace whose own end is
 * (src, sport) and whose other end is (dst, dport), asked of sock_diag
 * (the kernel answers within the send: no wait). 0 with *uid set; -ENOENT
 * when there is none; another negative errno when sock_diag cannot say. */
static int diag_uid(struct dptp_tcpstore_server *s, const uint8_t src[16], uint16_t sport,
		    const uint8_t dst[16], uint16_t dport, uint32_t *uid)
{
	if (s->nlfd < 0)
		s->nlfd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_SOCK_DIAG);
	if (s->nlfd < 0)
		return -errno;
	bool v4 = addr_v4(src) && addr_v4(dst);
	struct {
		struct nlmsghdr h;
		struct inet_diag_req_v2 r;
	} req = {
		.h = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY, .nlmsg_flags = NLM_F_REQUEST,
		      .nlmsg_seq = ++s->nlseq},
		.r = {.sdiag_family = v4 ? AF_INET : AF_INET6, .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u,
		      .id = {.idiag_sport = sport, .idiag_dport = dport,
			     .idiag_cookie = {INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE}}},
	};
	memcpy(req.r.id.idiag_src, v4 ? src + 12 : src, v4 ? 4 : 16);
	memcpy(req.r.id.idiag_dst, v4 ? dst + 12 : dst, v4 ? 4 : 16);
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	if (sendto(s->nlfd, &req, sizeof(req), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -errno;
	long buf[1024];
	for (;;) {
		ssize_t k = recv(s->nlfd, buf, sizeof(buf), MSG_DONTWAIT);
		if (k < 0)
			return errno == EINTR ? -EAGAIN : -errno;
		for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, (size_t)k); h = NLMSG_NEXT(h, k)) {
			if (h->nlmsg_seq != s->nlseq)
				continue; /* a late answer to an earlier question */
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error ? e->error : -ENOENT;
			}
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
				return -EPROTO;
			const struct inet_diag_msg *m = NLMSG_DATA(h);
			/* a listener or a time-wait entry is no client (the
			 * latter reports uid 0) */
			if (m->idiag_state == 10 || m->idiag_state == 6 || m->idiag_state == 12 ||
			    m->id.idiag_sport != sport || m->id.idiag_dport != dport)
				return -ENOENT;
			*uid = m->idiag_uid;
			return 0;
		}
	}
}

/* Who is at the other end of fd: its peer, found or made (NULL when out
 * of memory). A client socket of this host's network namespace is its
 * owner's uid; anything else is its address (IPv6 by its /64). Where
 * sock_diag cannot tell (not in this kernel), a loopback or own address is
 * taken for this host's user, as before peers were told apart. */
static struct peer *peer_of(struct dptp_tcpstore_server *s, int fd, const struct sockaddr_storage *ps)
{
	struct sockaddr_storage ss = {0};
	socklen_t sl = sizeof(ss);
	uint8_t pa[16], la[16] = {0};
	uint16_t pport, lport = 0;
	addr_norm(ps, pa, &pport);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		addr_norm(&ss, la, &lport);
	struct peer key = {0};
	uint32_t uid = 0;
	if (s->diag < 0) /* our own end says whether sock_diag answers here */
		s->diag = diag_uid(s, la, lport, pa, pport, &uid) == 0;
	if (s->diag && diag_uid(s, pa, pport, la, lport, &uid) == 0) {
		key.local = true;
		key.uid = uid;
	} else if (!s->diag && (memcmp(pa, la, 16) == 0 || memcmp(pa, &in6addr_loopback, 16) == 0 ||
				(addr_v4(pa) && pa[12] == 127))) {
		key.local = true;
		key.uid = (uint32_t)geteuid();
	} else {
		memcpy(key.addr, pa, addr_v4(pa) ? 16 : 8);
	}
	key.trusted = key.local && key.uid == (uint32_t)geteuid();
	for (size_t i = 0; i < s->npeers; i++) {
		struct peer *p = s->peers[i];
		if (p->local == key.local && p->uid == key.uid && memcmp(p->addr, key.addr, 16) == 0)
			return p;
	}
	if (s->npeers == s->cappeers) {
		size_t cap = s->cappeers ? s->cappeers * 2 : 16;
		struct peer **np = realloc(s->peers, cap * sizeof(*np));
		if (!np)
			return NULL;
		s->peers = np;
		s->cappeers = cap;
	}
	struct peer *p = malloc(sizeof(*p));
	if (!p)
		return NULL;
	*p = key;
	s->peers[s->npeers++] = p;
	return p;
}

/* The connections this process's other work keeps room for: the store
 * shares its process with an agent (node 0's dptp-run: its logs, workers,
 * PMIx server), whose open() must not meet EMFILE because the store took
 * the last descriptors (4096 nodes on the H100 box: 19,938 connections at
 * the peak under a limit of 20,000). Past it the store accepts no more for
 * a while: the kernel holds the next ones in the listen backlog, as when
 * accept(2) itself says EMFILE, until some close. */
static bool fds_short(const struct dptp_tcpstore_server *s)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return false;
	rlim_t keep = 32 + rl.rlim_cur / 32;
	return (rlim_t)s->nconns + keep >= rl.rlim_cur;
}

static void do_accept(struct dptp_tcpstore_server *s)
{
	if (dptp_now() < s->accept_pause_until)
		return;
	for (int i = 0; i < ACCEPTS_PER_STEP; i++) {
		if (fds_short(s)) {
			s->accept_pause_until = dptp_now() + 0.05;
			s->fd_pauses++;
			return;
		}
		struct sockaddr_storage ps;
		socklen_t pl = sizeof(ps);
		int fd = accept4(s->lfd, (struct sockaddr *)&ps, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				s->accept_pause_until = dptp_now() + 0.1;
			return;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (s->nconns == s->capconns) {
			size_t cap = s->capconns ? s->capconns * 2 : 16;
			struct conn **nc = realloc(s->conns, cap * sizeof(*nc));
			if (!nc) {
				close(fd);
				return;
			}
			s->conns = nc;
			s->capconns = cap;
		}
		struct peer *p = peer_of(s, fd, &ps);
		if (!p) {
			close(fd);
			return;
		}
		struct conn *c = NULL;
		if (over_budget(s, p, conn_cost(s, p), "a connection") || !(c = calloc(1, sizeof(*c)))) {
			/* refused: one peer's many connections share its part */
			release(s, p, 0);
			close(fd);
			stat_set(&s->st_rejected, stat_get(&s->st_rejected) + 1);
			continue;
		}
		c->fd = fd;
		c->need = 1;
		c->peer = p;
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			release(s, p, 0);
			close(fd);
			free(c);
			if (errno == ENOMEM || errno == ENOSPC)
				s->accept_pause_until = dptp_now() + 0.1;
			return;
		}
		buf_take(s, c, conn_cost(s, p), "a connection"); /* passed just above */
		c->idx = s->nconns;
		c->serial = ++s->serials;
		s->conns[s->nconns++] = c;
		s->accepted++;
		if (s->nconns > s->peak_conns)
			s->peak_conns = s->nconns;
	}
}

static const char *const op_names[DPTP_TCPSTORE_WATCH_KEY + 1] = {
	[DPTP_TCPSTORE_SET] = "set", [DPTP_TCPSTORE_COMPARE_SET] = "compare_set", [DPTP_TCPSTORE_GET] = "get",
	[DPTP_TCPSTORE_ADD] = "add", [DPTP_TCPSTORE_CHECK] = "check", [DPTP_TCPSTORE_WAIT] = "wait",
	[DPTP_TCPSTORE_GETNUMKEYS] = "getnumkeys", [DPTP_TCPSTORE_DELETE_KEY] = "delete_key",
	[DPTP_TCPSTORE_APPEND] = "append", [DPTP_TCPSTORE_MULTI_GET] = "multi_get",
	[DPTP_TCPSTORE_MULTI_SET] = "multi_set", [DPTP_TCPSTORE_CANCEL_WAIT] = "cancel_wait",
	[DPTP_TCPSTORE_PING] = "ping", [DPTP_TCPSTORE_QUEUE_PUSH] = "queue_push",
	[DPTP_TCPSTORE_QUEUE_POP] = "queue_pop", [DPTP_TCPSTORE_QUEUE_LEN] = "queue_len",
	[DPTP_TCPSTORE_LIST_KEYS] = "list_keys", [DPTP_TCPSTORE_WATCH_KEY] = "watch_key",
};

void dptp_tcpstore_server_stats(const struct dptp_tcpstore_server *s, char *line, size_t len)
{
	int k = snprintf(line, len, "port=%u steps=%llu accepted=%llu peak_conns=%zu cas_missed=%llu fd_pauses=%llu",
		(unsigned)s->port, (unsigned long long)s->steps, (unsigned long long)s->accepted, s->peak_conns,
		(unsigned long long)s->cas_missed, s->fd_pauses);
	for (size_t i = 0; i < DPTP_ARRAY_LEN(op_names) && k > 0 && (size_t)k < len; i++)
		if (s->op_n[i] && op_names[i])
			k += snprintf(line + k, len - (size_t)k, " %s=%llu %s_in=%llu %s_out=%llu", op_names[i],
				(unsigned long long)s->op_n[i], op_names[i], (unsigned long long)s->op_in[i], op_names[i],
				(unsigned long long)s->op_out[i]);
}

static void publish_stats(struct dptp_tcpstore_server *s)
{
	stat_set(&s->st_clients, s->nconns);
	stat_set(&s->st_buffered, s->buffered);
	stat_set(&s->st_keys, s->kv.n);
	stat_set(&s->st_used, s->used);
}

/* Sends what each connection with replies has queued; one that would
 * block waits for EPOLLOUT. */
static void flush_all(struct dptp_tcpstore_server *s)
{
	while (s->outq) {
		struct conn *c = s->outq;
		s->outq = c->onext;
		c->queued = false;
		if (c->dead)
			continue;
		conn_write(s, c);
		bool pending = !c->dead && c->outoff < c->outlen;
		if (pending != c->want_out && !c->dead) {
			struct epoll_event ev = {.events = EPOLLIN | (pending ? EPOLLOUT : 0), .data.ptr = c};
			if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
				c->want_out = pending;
			else
				conn_kill(s, c, false);
		}
	}
}

static void free_dead(struct dptp_tcpstore_server *s)
{
	while (s->deadq) {
		struct conn *c = s->deadq;
		s->deadq = c->dnext;
		struct conn *last = s->conns[--s->nconns];
		s->conns[c->idx] = last;
		last->idx = c->idx;
		conn_free(s, c);
	}
}

struct ready {
	uint64_t serial; /* 0: the listener or the wake-up */
	struct epoll_event ev;
};

static int cmp_ready(const void *a, const void *b)
{
	const struct ready *x = a, *y = b;
	return x->serial < y->serial ? -1 : x->serial > y->serial;
}

int dptp_tcpstore_server_step(struct dptp_tcpstore_server *s, int timeout_ms, struct dptp_err *err)
{
	bool paused = dptp_now() < s->accept_pause_until;
	if (paused == s->lfd_on) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->lfd};
		if (epoll_ctl(s->epfd, paused ? EPOLL_CTL_DEL : EPOLL_CTL_ADD, s->lfd, &ev) == 0)
			s->lfd_on = !paused;
	}
	if (paused && (timeout_ms < 0 || timeout_ms > 100))
		timeout_ms = 100;
	struct epoll_event evs[256];
	struct ready rd[256];
	int r = epoll_wait(s->epfd, evs, DPTP_ARRAY_LEN(evs), timeout_ms);
	if (r < 0) {
		if (errno == EINTR)
			return 0;
		return dptp_err_set(err, -errno, "tcpstore server: epoll_wait: %s", strerror(errno));
	}
	s->steps++;
	/* the ready connections in the order they came (as poll(2) over the
	 * list did): a write without a reply on one connection is served
	 * before a read that followed it on another */
	for (int i = 0; i < r; i++) {
		void *p = evs[i].data.ptr;
		rd[i].ev = evs[i];
		rd[i].serial = p == &s->wakefd || p == &s->lfd ? 0 : ((struct conn *)p)->serial;
	}
	qsort(rd, (size_t)r, sizeof(rd[0]), cmp_ready);
	bool accept = false;
	for (int i = 0; i < r; i++) {
		void *p = rd[i].ev.data.ptr;
		uint32_t events = rd[i].ev.events;
		if (p == &s->wakefd) {
			uint64_t v;
			ssize_t k = read(s->wakefd, &v, sizeof(v));
			(void)k;
			continue;
		}
		if (p == &s->lfd) {
			accept = true;
			continue;
		}
		struct conn *c = p;
		if (c->dead)
			continue;
		if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
			conn_read(s, c);
		if ((events & EPOLLOUT) && !c->dead && !c->queued) {
			c->queued = true;
			c->onext = s->outq;
			s->outq = c;
		}
	}
	if (accept)
		do_accept(s);
	/* every pending reply, including the ones a wake-up queued */
	flush_all(s);
	free_dead(s);
	publish_stats(s);
	return 0;
}

/* ---- lifecycle ---------------------------------------------------------------- */

static int try_bind(const char *host, uint16_t port, int backlog, int *fdout, uint16_t *portout,
		    struct dptp_err *err)
{
	char service[16];
	snprintf(service, sizeof(service), "%u", (unsigned)port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char plain[256];
	int g = getaddrinfo(dptp_host_unbracket(host, plain, sizeof(plain)), service, &hints, &res);
	if (g != 0)
		return dptp_err_set(err, -EADDRNOTAVAIL, "tcpstore server: cannot resolve '%s': %s",
				    host, gai_strerror(g));
	int last = -EADDRNOTAVAIL;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
				ai->ai_protocol);
		if (fd < 0) {
			last = -errno;
			continue;
		}
		int one = 1, zero = 0;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ai->ai_family == AF_INET6) {
			const struct sockaddr_in6 *a6 = (const void *)ai->ai_addr;
			if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr))
				setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
		}
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
			last = -errno;
			close(fd);
			continue;
		}
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
			last = -errno;
			close(fd);
			continue;
		}
		*portout = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
							  : ((struct sockaddr_in *)&ss)->sin_port);
		*fdout = fd;
		freeaddrinfo(res);
		return 0;
	}
	freeaddrinfo(res);
	return dptp_err_set(err, last, "tcpstore server: cannot listen on %s port %u: %s",
			    host, (unsigned)port, strerror(-last));
}

int dptp_tcpstore_server_create(const struct dptp_tcpstore_server_opts *opts,
				struct dptp_tcpstore_server **out, struct dptp_err *err)
{
	*out = NULL;
	struct dptp_tcpstore_server_opts o = {0};
	if (opts)
		o = *opts;
	struct dptp_tcpstore_server *s = calloc(1, sizeof(*s));
	if (!s)
		return dptp_err_set(err, -ENOMEM, "tcpstore server: out of memory");
	s->lfd = -1;
	s->nlfd = -1;
	s->epfd = -1;
	s->diag = -1;
	s->max_client_bytes = o.max_client_bytes ? o.max_client_bytes : DPTP_TCPSTORE_DEFAULT_CLIENT_BYTES;
	s->lim.max_key = o.limits.max_key ? o.limits.max_key : DPTP_TCPSTORE_MAX_KEY;
	s->lim.max_value = o.limits.max_value ? o.limits.max_value : DPTP_TCPSTORE_MAX_VALUE;
	s->lim.max_keys = o.limits.max_keys ? o.limits.max_keys : DPTP_TCPSTORE_MAX_KEYS;
	s->max_total = o.max_total_bytes;
	const char *budget = getenv("DPTP_STORE_MAX_BYTES");
	if (!s->max_total && budget && *budget) {
		uint64_t v;
		if (dptp_parse_u64(budget, 1u << 20, UINT64_MAX, true, &v) < 0) {
			free(s);
			return dptp_err_set(err, -EINVAL,
				"invalid DPTP_STORE_MAX_BYTES='%s': expected a size of at least 1M (K/M/G suffixes)", budget);
		}
		s->max_total = (size_t)v;
	}
	if (!s->max_total)
		s->max_total = DPTP_TCPSTORE_DEFAULT_TOTAL_BYTES;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 0)
		s->fd_share = s->max_total / (size_t)rl.rlim_cur;
	s->log = o.log;
	s->log_arg = o.log_arg;
	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &s->wakefd};
	if (s->epfd < 0 || s->wakefd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wakefd, &wev) < 0) {
		int rc = dptp_err_set(err, -errno, "tcpstore server: epoll/eventfd: %s", strerror(errno));
		dptp_tcpstore_server_destroy(s);
		return rc;
	}
	int backlog = o.backlog > 0 ? o.backlog : 16384;
	int rc;
	if (o.host) {
		rc = try_bind(o.host, o.port, backlog, &s->lfd, &s->port, err);
	} else {
		rc = try_bind("::", o.port, backlog, &s->lfd, &s->port, err);
		if (rc < 0)
			rc = try_bind("0.0.0.0", o.port, backlog, &s->lfd, &s->port, err);
	}
	if (rc < 0) {
		dptp_tcpstore_server_destroy(s);
		return rc;
	}
	*out = s;
	return 0;
}

static void *server_thread(void *arg)
{
	struct dptp_tcpstore_server *s = arg;
	while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		if (dptp_tcpstore_server_step(s, -1, NULL) < 0) {
			/* out of memory for the poll set: back off a little */
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

int dptp_tcpstore_server_start(struct dptp_tcpstore_server *s, struct dptp_err *err)
{
	if (s->running)
		return dptp_err_set(err, -EALREADY, "tcpstore server: already running");
	__atomic_store_n(&s->stop, 0, __ATOMIC_RELEASE);
	int rc = pthread_create(&s->thread, NULL, server_thread, s);
	if (rc)
		return dptp_err_set(err, -rc, "tcpstore server: cannot start its thread: %s", strerror(rc));
	s->running = true;
	return 0;
}

void dptp_tcpstore_server_stop(struct dptp_tcpstore_server *s)
{
	if (!s || !s->running)
		return;
	__atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
	uint64_t one = 1;
	ssize_t k = write(s->wakefd, &one, sizeof(one));
	(void)k;
	pthread_join(s->thread, NULL);
	s->running = false;
}

void dptp_tcpstore_server_destroy(struct dptp_tcpstore_server *s)
{
	if (!s)
		return;
	dptp_tcpstore_server_stop(s);
	for (size_t i = 0; i < s->nconns; i++)
		conn_free(s, s->conns[i]);
	free(s->conns);
	if (s->epfd >= 0)
		close(s->epfd);
	map_clear(&s->kv);
	map_clear(&s->queues);
	map_clear(&s->widx);
	map_clear(&s->watches);
	for (size_t i = 0; i < s->npeers; i++)
		free(s->peers[i]);
	free(s->peers);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->nlfd >= 0)
		close(s->nlfd);
	if (s->wakefd >= 0)
		close(s->wakefd);
	free(s);
}

uint16_t dptp_tcpstore_server_port(const struct dptp_tcpstore_server *s)
{
	return s->port;
}

size_t dptp_tcpstore_server_nclients(const struct dptp_tcpstore_server *s)
{
	return stat_get(&s->st_clients);
}

size_t dptp_tcpstore_server_buffered(const struct dptp_tcpstore_server *s)
{
	return stat_get(&s->st_buffered);
}

size_t dptp_tcpstore_server_nkeys(const struct dptp_tcpstore_server *s)
{
	return stat_get(&s->st_keys);
}

size_t dptp_tcpstore_server_nrejected(const struct dptp_tcpstore_server *s)
{
	return stat_get(&s->st_rejected);
}

size_t dptp_tcpstore_server_used(const struct dptp_tcpstore_server *s)
{
	return stat_get(&s->st_used);
}
