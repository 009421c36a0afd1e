/* Cross-node PMIx fences over the store (see xnode.h). */
#include "xnode.h"

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

#include "env.h"
#include "tcpstore.h"

enum xstate { X_ADD, X_WAIT, X_MGET, X_WATCH };

struct xop {
	int fd;
	enum xstate st;
	uint8_t *out, *in;
	size_t outlen, outoff, outcap, inlen, incap;
	double deadline;
	struct pmix_srv_fence *fence; /* NULL: the failure watch */
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
};

__attribute__((format(printf, 1, 2)))
static void xlog(const char *fmt, ...)
{
	char pfx[96];
	va_list ap;
	env_glog_prefix('E', pfx, sizeof(pfx));
	fputs(pfx, stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- frames ---- */

static int put(struct xop *o, const void *p, size_t n)
{
	if (o->outlen + n > o->outcap) {
		size_t cap = (o->outlen + n) * 2;
		uint8_t *g = realloc(o->out, cap);
		if (!g)
			return -ENOMEM;
		o->out = g;
		o->outcap = cap;
	}
	memcpy(o->out + o->outlen, p, n);
	o->outlen += n;
	return 0;
}

static int put_u8(struct xop *o, uint8_t v) { return put(o, &v, 1); }
static int put_u64(struct xop *o, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	return put(o, b, 8);
}
static int put_str(struct xop *o, const void *p, size_t n) { return put_u64(o, n) || put(o, p, n) ? -ENOMEM : 0; }
static uint64_t get_u64(const uint8_t *b)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | b[i];
	return v;
}

static int handshake(struct xop *o)
{
	uint8_t h[10] = {DPTP_TCPSTORE_VALIDATE, 0xce, 0xf7, 0x85, 0x3c, DPTP_TCPSTORE_PING};
	uint32_t nonce = (uint32_t)getpid();
	memcpy(h + 6, &nonce, 4); /* little-endian hosts only, as the protocol */
	return put(o, h, sizeof(h));
}

static int frame_set(struct xop *o, const char *key, const void *v, size_t n)
{
	return put_u8(o, DPTP_TCPSTORE_SET) || put_str(o, key, strlen(key)) || put_str(o, v, n) ? -ENOMEM : 0;
}

static int frame_wait(struct xop *o, const char *key)
{
	return put_u8(o, DPTP_TCPSTORE_WAIT) || put_u64(o, 1) || put_str(o, key, strlen(key)) ? -ENOMEM : 0;
}

/* ---- connections ---- */

static int dial(const struct xnode *x)
{
	char service[16];
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
	int fd = -1;
	snprintf(service, sizeof(service), "%u", x->port);
	if (getaddrinfo(x->host, service, &hints, &res) != 0)
		return -EHOSTUNREACH;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
			close(fd);
			fd = -1;
			continue;
		}
		/* bounded: the store answered the rendezvous moments ago */
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		int soerr = 0;
		socklen_t sl = sizeof(soerr);
		if (poll(&p, 1, 5000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	return fd >= 0 ? fd : -ECONNREFUSED;
}

static void op_free(struct xop *o)
{
	if (o->fd >= 0)
		close(o->fd);
	free(o->out);
	free(o->in);
	free(o->inv);
	free(o);
}

static void op_fail(struct xop *o, const char *why)
{
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
	if (x->nops >= XNODE_MAX_FDS)
		return NULL;
	o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->fd = dial(x);
	if (o->fd < 0 || handshake(o) < 0) {
		op_free(o);
		return NULL;
	}
	o->deadline = timeout > 0 ? dptp_now() + timeout : 0;
	x->ops[x->nops++] = o;
	return o;
}

int xnode_start(struct xnode **out, const char *host, unsigned port, const char *prefix,
	const struct rdzv_node *nodes, unsigned nnodes, unsigned me, double timeout, struct dptp_err *err)
{
	struct xnode *x = calloc(1, sizeof(*x));
	struct xop *w;
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
	w = op_new(x, 0);
	snprintf(key, sizeof(key), "%sfailed", prefix);
	if (!w || frame_wait(w, key) < 0) {
		xnode_stop(x);
		return dptp_err_set(err, -ECONNREFUSED, "cannot watch %s on the store at %s:%u", key, host, port);
	}
	w->st = X_WATCH;
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

size_t xnode_pollfds(struct xnode *x, struct pollfd *pfd, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; x && i < x->nops && n < max; i++)
		pfd[n++] = (struct pollfd){.fd = x->ops[i]->fd,
			.events = POLLIN | (x->ops[i]->outoff < x->ops[i]->outlen ? POLLOUT : 0)};
	return n;
}

/* Consumes what the state needs from o->in. 1: the op is done (freed by the
 * caller), 0: more bytes needed, <0: protocol error. */
static int advance(struct xnode *x, struct xop *o)
{
	char key[256];
	for (;;) {
		size_t need = o->st == X_WATCH || o->st == X_ADD ? 4 : 0; /* the PING echo comes first */
		if (need && o->inlen < need + (o->st == X_ADD ? 8 : 1))
			return 0;
		switch (o->st) {
		case X_WATCH:
			x->failed_node = (int)x->nnodes; /* which node: unknown here */
			return 1;
		case X_ADD: {
			uint64_t v = get_u64(o->in + 4);
			o->inlen -= 12;
			memmove(o->in, o->in + 12, o->inlen);
			if (v == o->ninv) {
				snprintf(key, sizeof(key), "%sdone", o->base);
				if (frame_set(o, key, "1", 1) < 0)
					return -ENOMEM;
			}
			snprintf(key, sizeof(key), "%sdone", o->base);
			if (frame_wait(o, key) < 0)
				return -ENOMEM;
			o->st = X_WAIT;
			break;
		}
		case X_WAIT:
			if (o->inlen < 1)
				return 0;
			if (o->in[0] != DPTP_TCPSTORE_STOP_WAITING)
				return -EPROTO;
			o->inlen--;
			memmove(o->in, o->in + 1, o->inlen);
			if (put_u8(o, DPTP_TCPSTORE_MULTI_GET) || put_u64(o, o->ninv))
				return -ENOMEM;
			for (size_t i = 0; i < o->ninv; i++) {
				snprintf(key, sizeof(key), "%sblob/%u", o->base, o->inv[i]);
				if (put_str(o, key, strlen(key)) < 0)
					return -ENOMEM;
			}
			o->st = X_MGET;
			break;
		case X_MGET: {
			size_t off = 0, total = 0;
			for (size_t i = 0; i < o->ninv; i++) {
				if (o->inlen < off + 8)
					return 0;
				uint64_t l = get_u64(o->in + off);
				if (l > DPTP_TCPSTORE_MAX_VALUE)
					return -EPROTO;
				if (o->inlen < off + 8 + l)
					return 0;
				off += 8 + l;
				total += l;
			}
			/* concatenate in place */
			uint8_t *cat = malloc(total ? total : 1);
			if (!cat)
				return -ENOMEM;
			off = 0;
			size_t w = 0;
			for (size_t i = 0; i < o->ninv; i++) {
				uint64_t l = get_u64(o->in + off);
				memcpy(cat + w, o->in + off + 8, l);
				w += l;
				off += 8 + l;
			}
			pmix_srv_fence_complete(o->fence, true, cat, total);
			o->fence = NULL;
			free(cat);
			return 1;
		}
		}
	}
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
		if (pfd[i].fd != o->fd)
			continue;
		if (pfd[i].revents & POLLOUT) {
			ssize_t w = send(o->fd, o->out + o->outoff, o->outlen - o->outoff, MSG_NOSIGNAL);
			if (w > 0) {
				o->outoff += (size_t)w;
				if (o->outoff == o->outlen)
					o->outoff = o->outlen = 0;
			} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
				why = strerror(errno);
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
				if (r > 0)
					o->inlen += (size_t)r;
				else if (r == 0)
					why = "the store closed the connection";
				else if (errno != EAGAIN && errno != EINTR)
					why = strerror(errno);
			}
			if (!why && (rc = advance(x, o)) < 0)
				why = rc == -ENOMEM ? "out of memory" : "unexpected reply from the store";
		}
		if (!why && rc == 0 && o->deadline > 0 && now >= o->deadline)
			why = "timed out";
		if (why || rc == 1) {
			if (o->st == X_WATCH && why && !strcmp(why, "the store closed the connection"))
				x->failed_node = (int)x->nnodes; /* node 0 is gone */
			else if (o->st == X_WATCH && why)
				xlog("lost the failure watch on the store: %s", why);
			memmove(&x->ops[i], &x->ops[i + 1], (x->nops - i - 1) * sizeof(x->ops[0]));
			x->nops--;
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
			op_fail(o, "timed out");
		}
	}
	int f = x->failed_node;
	x->failed_node = -1;
	return f;
}
