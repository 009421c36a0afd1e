/* TCPStore client: torch 2.11's request sequences, every call bounded by a
 * deadline; torch 1.13's protocol when the server speaks only that. */
#include "wire/tcpstore.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PREFIX_MAX DPTP_TCPSTORE_MAX_KEY
/* Largest value the client accepts in a reply (torch's libuv server stores
 * at most 8 MiB; the legacy backend has no limit). */
#define RECV_MAX ((uint64_t)1 << 31)

/* The connection, shared by the clients made with client_share(). */
struct link {
	int fd;
	bool broken;
	bool legacy;   /* the server is torch before 2.1: legacy opcodes */
	unsigned refs;
};

struct dptp_tcpstore_client {
	struct link *l;
	char *host;    /* for reconnecting */
	uint16_t port;
	double timeout;
	double retry_max; /* the backoff's cap between connect attempts */
	int64_t init_count;
	char *prefix;
	size_t prefix_len;
	struct dptp_buf w;  /* request being built */
	char peer[300];
	int abort_fd; /* -1: none */
};

/* The abort fd of the client whose call is running on this thread: set by
 * flush() and create(), read by the waits below (they only get the fd). */
static __thread int cur_abort = -1;

/* ---- request building ---------------------------------------------------- */

static void w_reset(struct dptp_tcpstore_client *c)
{
	c->w.len = 0;
	c->w.oom = false;
}

static void w_bytes(struct dptp_tcpstore_client *c, const void *p, size_t n)
{
	dptp_buf_add(&c->w, p, n);
}

static void w_u64(struct dptp_tcpstore_client *c, uint64_t v)
{
	dptp_tcpstore_frame_u64(&c->w, v);
}

static void w_str(struct dptp_tcpstore_client *c, const void *p, size_t n)
{
	dptp_tcpstore_frame_str(&c->w, p, n);
}

/* Wire key: prefix + key. */
static int w_key(struct dptp_tcpstore_client *c, const char *key, struct dptp_err *err)
{
	if (!key)
		return dptp_err_set(err, -EINVAL, "tcpstore: NULL key");
	size_t kl = strlen(key);
	if (kl + c->prefix_len > DPTP_TCPSTORE_MAX_KEY)
		return dptp_err_set(err, -EMSGSIZE, "tcpstore: key '%.64s...' longer than %u bytes",
				    key, DPTP_TCPSTORE_MAX_KEY);
	w_u64(c, kl + c->prefix_len);
	w_bytes(c, c->prefix, c->prefix_len);
	w_bytes(c, key, kl);
	return 0;
}

static int w_value_check(const void *val, size_t len, struct dptp_err *err)
{
	if (len > DPTP_TCPSTORE_MAX_VALUE)
		return dptp_err_set(err, -EMSGSIZE, "tcpstore: value of %zu bytes over the %u-byte limit",
				    len, DPTP_TCPSTORE_MAX_VALUE);
	if (len && !val)
		return dptp_err_set(err, -EINVAL, "tcpstore: NULL value");
	return 0;
}

/* ---- I/O with a deadline ---------------------------------------------------- */

static int remaining_ms(double deadline)
{
	double left = deadline - dptp_now();
	if (left <= 0)
		return 0;
	if (left > 2e6)
		return 2000000000;
	return (int)ceil(left * 1000.0);
}

static int fail(struct dptp_tcpstore_client *c, int rc, struct dptp_err *err, const char *what)
{
	c->l->broken = true;
	switch (rc) {
	case -ETIMEDOUT:
		return dptp_err_set(err, rc, "tcpstore %s: timed out %s", c->peer, what);
	case -ECONNRESET:
		return dptp_err_set(err, rc, "tcpstore %s: connection closed by the server %s", c->peer, what);
	case -EPROTO:
		return dptp_err_set(err, rc, "tcpstore %s: unexpected reply %s", c->peer, what);
	case -ENOMEM:
		return dptp_err_set(err, rc, "tcpstore %s: out of memory %s", c->peer, what);
	case -EINTR:
		return dptp_err_set(err, rc, "tcpstore %s: interrupted by a signal %s", c->peer, what);
	default:
		return dptp_err_set(err, rc, "tcpstore %s: %s %s", c->peer, strerror(-rc), what);
	}
}

static int send_all(int fd, const void *buf, size_t n, double deadline)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == EPIPE ? -ECONNRESET : -errno;
		struct pollfd pfd[2] = {{.fd = fd, .events = POLLOUT}, {.fd = cur_abort, .events = POLLIN}};
		int ms = remaining_ms(deadline);
		if (ms == 0)
			return -ETIMEDOUT;
		int r = poll(pfd, cur_abort >= 0 ? 2 : 1, ms);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		if (r > 0 && !pfd[0].revents && pfd[1].revents)
			return -EINTR;
	}
	return 0;
}

/* Waits until fd is readable. 1 readable, 0 timeout, <0 error. */
static int wait_readable(int fd, double deadline)
{
	for (;;) {
		struct pollfd pfd[2] = {{.fd = fd, .events = POLLIN}, {.fd = cur_abort, .events = POLLIN}};
		int ms = remaining_ms(deadline);
		int r = poll(pfd, cur_abort >= 0 ? 2 : 1, ms);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r > 0 && !pfd[0].revents && pfd[1].revents)
			return -EINTR;
		return r > 0;
	}
}

static int recv_all(int fd, void *buf, size_t n, double deadline)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int r = wait_readable(fd, deadline);
		if (r < 0)
			return r;
		if (r == 0)
			return -ETIMEDOUT;
	}
	return 0;
}

static int recv_u8(int fd, uint8_t *v, double deadline)
{
	return recv_all(fd, v, 1, deadline);
}

static int recv_u64(int fd, uint64_t *v, double deadline)
{
	uint8_t b[8];
	int rc = recv_all(fd, b, 8, deadline);
	if (rc < 0)
		return rc;
	*v = dptp_le64_get(b);
	return 0;
}

/* A u64 length + bytes, up to max bytes (refused before allocating). */
static int recv_buf(int fd, struct dptp_tcpstore_buf *out, uint64_t max, double deadline)
{
	uint64_t n = 0;
	int rc = recv_u64(fd, &n, deadline);
	if (rc < 0)
		return rc;
	if (n > max)
		return -EPROTO;
	uint8_t *d = malloc((size_t)n + 1);
	if (!d)
		return -ENOMEM;
	rc = recv_all(fd, d, (size_t)n, deadline);
	if (rc < 0) {
		free(d);
		return rc;
	}
	d[n] = 0;
	out->data = d;
	out->len = (size_t)n;
	return 0;
}

static int begin(struct dptp_tcpstore_client *c, uint8_t op, struct dptp_err *err)
{
	if (c->l->broken)
		return dptp_err_set(err, -ENOTCONN, "tcpstore %s: connection unusable after an earlier error",
				    c->peer);
	int wire = op;
	if (c->l->legacy && (wire = dptp_tcpstore_op_to_legacy(op)) < 0)
		return dptp_err_set(err, -ENOTSUP, "tcpstore %s: the server is torch before 2.1, which has no %s",
				    c->peer, dptp_tcpstore_op_name(op));
	w_reset(c);
	dptp_tcpstore_frame_u8(&c->w, (uint8_t)wire);
	return 0;
}

static int flush(struct dptp_tcpstore_client *c, double deadline, struct dptp_err *err,
		 const char *what)
{
	if (c->w.oom)
		return dptp_err_set(err, -ENOMEM, "tcpstore: out of memory building %s", what);
	cur_abort = c->abort_fd;
	int rc = send_all(c->l->fd, c->w.buf, c->w.len, deadline);
	if (rc < 0)
		return fail(c, rc, err, what);
	return 0;
}

static double deadline_of(const struct dptp_tcpstore_client *c)
{
	return dptp_now() + c->timeout;
}

/* ---- connect ------------------------------------------------------------------ */

static int connect_once(const struct addrinfo *ai, double deadline)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	if (fd < 0)
		return -errno;
	int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
	if (rc < 0 && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		return rc;
	}
	if (rc < 0) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		int r;
		do
			r = poll(&pfd, 1, remaining_ms(deadline));
		while (r < 0 && errno == EINTR);
		if (r <= 0) {
			close(fd);
			return r == 0 ? -ETIMEDOUT : -errno;
		}
		int soerr = 0;
		socklen_t sl = sizeof(soerr);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
			soerr = errno;
		if (soerr) {
			close(fd);
			return -soerr;
		}
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Sleeps s seconds; -EINTR at once when the abort fd becomes readable. */
static int sleep_s(double s)
{
	double until = dptp_now() + s;
	for (;;) {
		struct pollfd pfd = {.fd = cur_abort, .events = POLLIN};
		int ms = remaining_ms(until);
		if (ms == 0)
			return 0;
		int r = poll(&pfd, cur_abort >= 0 ? 1 : 0, ms);
		if (r > 0)
			return -EINTR;
	}
}

static int do_connect(struct dptp_tcpstore_client *c, const char *host, uint16_t port,
		      double deadline, struct dptp_err *err)
{
	char service[16];
	snprintf(service, sizeof(service), "%u", (unsigned)port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	double backoff = 0.01;
	unsigned seed = (unsigned)getpid() ^ (unsigned)(dptp_now() * 1e6);
	int last = -ECONNREFUSED;
	for (;;) {
		struct addrinfo *res = NULL;
		char plain[256];
		int g = getaddrinfo(dptp_host_unbracket(host, plain, sizeof(plain)), service, &hints, &res);
		if (g == 0) {
			for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
				int fd = connect_once(ai, deadline);
				if (fd >= 0) {
					freeaddrinfo(res);
					c->l->fd = fd;
					return 0;
				}
				last = fd;
			}
			freeaddrinfo(res);
		} else {
			last = -EHOSTUNREACH;
			if (g == EAI_NONAME)
				return dptp_err_set(err, -EHOSTUNREACH, "tcpstore: unknown host '%s'", host);
		}
		double left = deadline - dptp_now();
		if (left <= 0)
			break;
		/* exponential backoff with jitter in [backoff/2, backoff] */
		double jitter = backoff * (0.5 + 0.5 * ((double)rand_r(&seed) / RAND_MAX));
		if (sleep_s(jitter < left ? jitter : left) < 0)
			return dptp_err_set(err, -EINTR, "tcpstore: connecting to %s: interrupted by a signal", c->peer);
		backoff = backoff * 2 > c->retry_max ? c->retry_max : backoff * 2;
	}
	return dptp_err_set(err, last == -ETIMEDOUT ? -ETIMEDOUT : last,
			    "tcpstore: cannot connect to %s: %s (gave up after the timeout)",
			    c->peer, strerror(-last));
}

/* A new connection in place of the old one (the server forgets the old
 * one's pending WAIT with it). */
static int reconnect(struct dptp_tcpstore_client *c, double deadline, struct dptp_err *err)
{
	close(c->l->fd);
	c->l->fd = -1;
	int rc = do_connect(c, c->host, c->port, deadline, err);
	if (rc < 0)
		c->l->broken = true;
	return rc;
}

/* torch before 2.1 reads our VALIDATE as a SET whose key would be over
 * 2^63 bytes long and closes the connection: connect again and speak its
 * protocol, once a GETNUMKEYS shows the peer answers it. */
static int fall_back_to_legacy(struct dptp_tcpstore_client *c, double deadline, struct dptp_err *err)
{
	DPTP_TRY(reconnect(c, deadline, err));
	c->l->legacy = true;
	c->l->broken = false;
	int64_t n = 0;
	double saved = c->timeout;
	c->timeout = deadline - dptp_now() > 0 ? deadline - dptp_now() : 0.001;
	int rc = dptp_tcpstore_client_num_keys(c, &n, err);
	c->timeout = saved;
	if (rc < 0)
		return dptp_err_set(err, rc, "tcpstore %s: the server closed the connection on VALIDATE and "
				    "does not answer torch 1.13's GETNUMKEYS either (not a TCPStore?)", c->peer);
	return 0;
}

int dptp_tcpstore_client_create(const struct dptp_tcpstore_client_opts *opts,
				struct dptp_tcpstore_client **out, struct dptp_err *err)
{
	*out = NULL;
	if (!opts || !opts->host || !*opts->host)
		return dptp_err_set(err, -EINVAL, "tcpstore: no host given");
	struct dptp_tcpstore_client *c = calloc(1, sizeof(*c));
	if (!c)
		return dptp_err_set(err, -ENOMEM, "tcpstore: out of memory");
	int rc;
	c->l = calloc(1, sizeof(*c->l));
	if (!c->l) {
		free(c);
		return dptp_err_set(err, -ENOMEM, "tcpstore: out of memory");
	}
	c->l->fd = -1;
	c->l->refs = 1;
	c->abort_fd = opts->abort_fd ? *opts->abort_fd : -1;
	cur_abort = c->abort_fd;
	c->timeout = opts->timeout > 0 ? opts->timeout : DPTP_TCPSTORE_DEFAULT_TIMEOUT;
	c->retry_max = opts->retry_max > 0 ? opts->retry_max : 1.0;
	c->port = opts->port;
	c->host = strdup(opts->host);
	if (!c->host) {
		rc = dptp_err_set(err, -ENOMEM, "tcpstore: out of memory");
		goto out_err;
	}
	snprintf(c->peer, sizeof(c->peer), strchr(opts->host, ':') ? "[%s]:%u" : "%s:%u",
		 opts->host, (unsigned)opts->port);
	rc = dptp_tcpstore_client_set_prefix(c, "/");
	if (rc < 0) {
		dptp_err_set(err, rc, "tcpstore: out of memory");
		goto out_err;
	}
	double deadline = deadline_of(c);
	rc = do_connect(c, opts->host, opts->port, deadline, err);
	if (rc < 0)
		goto out_err;

	/* handshake: VALIDATE + PING in one write, then the 4-byte echo; the
	 * default nonce's bit 23 makes the key length a torch 1.13 server reads
	 * there at least 2^63, refused before any allocation */
	uint32_t nonce = opts->ping_nonce ? opts->ping_nonce : (uint32_t)getpid() | 0x800000u;
	w_reset(c);
	dptp_tcpstore_frame_handshake(&c->w, nonce);
	rc = flush(c, deadline, err, "sending the handshake");
	uint8_t echo[4];
	if (rc == 0)
		rc = recv_all(c->l->fd, echo, 4, deadline);
	if (rc == -ECONNRESET) {
		rc = fall_back_to_legacy(c, deadline, err);
		if (rc < 0)
			goto out_err;
		goto handshake_done;
	}
	if (rc < 0) {
		fail(c, rc, err, "waiting for the PING echo");
		goto out_err;
	}
	uint32_t got = (uint32_t)echo[0] | (uint32_t)echo[1] << 8 | (uint32_t)echo[2] << 16 |
		       (uint32_t)echo[3] << 24;
	if (got != nonce) {
		rc = dptp_err_set(err, -EPROTO, "tcpstore %s: PING echo %u, expected %u (not a TCPStore?)",
				  c->peer, got, nonce);
		goto out_err;
	}
handshake_done:
	if (opts->add_init) {
		char *saved = c->prefix;
		size_t saved_len = c->prefix_len;
		c->prefix = "";
		c->prefix_len = 0;
		rc = dptp_tcpstore_client_add(c, "init/", 1, &c->init_count, err);
		c->prefix = saved;
		c->prefix_len = saved_len;
		if (rc < 0)
			goto out_err;
	}
	*out = c;
	return 0;
out_err:
	dptp_tcpstore_client_destroy(c);
	return rc;
}

void dptp_tcpstore_client_destroy(struct dptp_tcpstore_client *c)
{
	if (!c)
		return;
	if (c->l && --c->l->refs == 0) {
		if (c->l->fd >= 0)
			close(c->l->fd);
		free(c->l);
	}
	free(c->host);
	free(c->prefix);
	dptp_buf_release(&c->w);
	free(c);
}

int dptp_tcpstore_client_share(struct dptp_tcpstore_client *c, struct dptp_tcpstore_client **out,
			       struct dptp_err *err)
{
	struct dptp_tcpstore_client *s = calloc(1, sizeof(*s));
	*out = NULL;
	if (!s || !(s->host = strdup(c->host)) || dptp_tcpstore_client_set_prefix(s, "/") < 0) {
		if (s)
			free(s->host);
		free(s);
		return dptp_err_set(err, -ENOMEM, "tcpstore: out of memory");
	}
	s->l = c->l;
	s->l->refs++;
	s->port = c->port;
	s->timeout = c->timeout;
	s->retry_max = c->retry_max;
	s->abort_fd = c->abort_fd;
	snprintf(s->peer, sizeof(s->peer), "%s", c->peer);
	*out = s;
	return 0;
}

bool dptp_tcpstore_client_legacy(const struct dptp_tcpstore_client *c)
{
	return c->l->legacy;
}

int64_t dptp_tcpstore_client_init_count(const struct dptp_tcpstore_client *c)
{
	return c->init_count;
}

void dptp_tcpstore_client_set_timeout(struct dptp_tcpstore_client *c, double timeout)
{
	if (timeout > 0)
		c->timeout = timeout;
}

int dptp_tcpstore_client_set_prefix(struct dptp_tcpstore_client *c, const char *prefix)
{
	size_t n = prefix ? strlen(prefix) : 0;
	if (n > PREFIX_MAX)
		return -EMSGSIZE;
	char *p = malloc(n + 1);
	if (!p)
		return -ENOMEM;
	if (n)
		memcpy(p, prefix, n);
	p[n] = 0;
	free(c->prefix);
	c->prefix = p;
	c->prefix_len = n;
	return 0;
}

int dptp_tcpstore_client_push_prefix(struct dptp_tcpstore_client *c, const char *p)
{
	size_t pl = p ? strlen(p) : 0;
	if (c->prefix_len + pl + 1 > PREFIX_MAX)
		return -EMSGSIZE;
	char *np = malloc(c->prefix_len + pl + 2);
	if (!np)
		return -ENOMEM;
	memcpy(np, c->prefix, c->prefix_len);
	if (pl)
		memcpy(np + c->prefix_len, p, pl);
	np[c->prefix_len + pl] = '/';
	np[c->prefix_len + pl + 1] = 0;
	free(c->prefix);
	c->prefix = np;
	c->prefix_len += pl + 1;
	return 0;
}

const char *dptp_tcpstore_client_get_prefix(const struct dptp_tcpstore_client *c)
{
	return c->prefix;
}

/* ---- operations ---------------------------------------------------------------- */

static int send_kv(struct dptp_tcpstore_client *c, uint8_t op, const char *key,
		   const void *val, size_t len, struct dptp_err *err)
{
	DPTP_TRY(w_value_check(val, len, err));
	DPTP_TRY(begin(c, op, err));
	DPTP_TRY(w_key(c, key, err));
	w_str(c, val, len);
	return flush(c, deadline_of(c), err, dptp_tcpstore_op_name(op));
}

int dptp_tcpstore_client_set(struct dptp_tcpstore_client *c, const char *key,
			     const void *val, size_t len, struct dptp_err *err)
{
	return send_kv(c, DPTP_TCPSTORE_SET, key, val, len, err);
}

int dptp_tcpstore_client_append(struct dptp_tcpstore_client *c, const char *key,
				const void *val, size_t len, struct dptp_err *err)
{
	return send_kv(c, DPTP_TCPSTORE_APPEND, key, val, len, err);
}

int dptp_tcpstore_client_queue_push(struct dptp_tcpstore_client *c, const char *key,
				    const void *val, size_t len, struct dptp_err *err)
{
	return send_kv(c, DPTP_TCPSTORE_QUEUE_PUSH, key, val, len, err);
}

static int keys_frame(struct dptp_tcpstore_client *c, uint8_t op, const char *const *keys,
		      size_t n, struct dptp_err *err)
{
	if (n > DPTP_TCPSTORE_MAX_KEYS)
		return dptp_err_set(err, -EMSGSIZE, "tcpstore: %zu keys in one request, limit %u",
				    n, DPTP_TCPSTORE_MAX_KEYS);
	if (n && !keys)
		return dptp_err_set(err, -EINVAL, "tcpstore: NULL key list");
	DPTP_TRY(begin(c, op, err));
	w_u64(c, n);
	for (size_t i = 0; i < n; i++)
		DPTP_TRY(w_key(c, keys[i], err));
	return 0;
}

/* Names the keys in a timeout message: "/a, /b". */
static void keys_text(const struct dptp_tcpstore_client *c, const char *const *keys, size_t n,
		      char *out, size_t cap)
{
	size_t off = 0;
	out[0] = 0;
	for (size_t i = 0; i < n && off + 1 < cap; i++) {
		int k = snprintf(out + off, cap - off, "%s%s%s", i ? ", " : "", c->prefix, keys[i]);
		if (k < 0)
			break;
		off += (size_t)k;
	}
}

/* Sends WAIT and reads its reply within timeout seconds; on timeout cancels. */
static int wait_keys(struct dptp_tcpstore_client *c, const char *const *keys, size_t n,
		     double timeout, struct dptp_err *err)
{
	DPTP_TRY(keys_frame(c, DPTP_TCPSTORE_WAIT, keys, n, err));
	double deadline = dptp_now() + timeout;
	DPTP_TRY(flush(c, deadline, err, "sending WAIT"));
	int r = wait_readable(c->l->fd, deadline);
	if (r < 0)
		return fail(c, r, err, "during WAIT");
	uint8_t v = 0xff;
	double drain = dptp_now() + (c->timeout < 30 ? c->timeout : 30);
	if (r > 0) {
		int rc = recv_u8(c->l->fd, &v, drain);
		if (rc < 0)
			return fail(c, rc, err, "reading the WAIT reply");
		if (v != DPTP_TCPSTORE_STOP_WAITING)
			return fail(c, -EPROTO, err, "to WAIT");
		return 0;
	}
	char names[512];
	keys_text(c, keys, n, names, sizeof(names));
	if (c->l->legacy) {
		/* torch 1.13 has no CANCEL_WAIT: a new connection ends the wait */
		int rc = reconnect(c, drain, err);
		if (rc < 0)
			return rc;
		return dptp_err_set(err, -ETIMEDOUT, "wait timeout after %lldms, keys: %s",
				    (long long)llround(timeout * 1000.0), names);
	}
	/* timed out: CANCEL_WAIT, then drain a late STOP_WAITING and WAIT_CANCELED */
	DPTP_TRY(begin(c, DPTP_TCPSTORE_CANCEL_WAIT, err));
	DPTP_TRY(flush(c, drain, err, "sending CANCEL_WAIT"));
	int rc = recv_u8(c->l->fd, &v, drain);
	if (rc < 0)
		return fail(c, rc, err, "reading the CANCEL_WAIT reply");
	bool arrived = false;
	if (v == DPTP_TCPSTORE_STOP_WAITING) {
		arrived = true;
		rc = recv_u8(c->l->fd, &v, drain);
		if (rc < 0)
			return fail(c, rc, err, "reading the CANCEL_WAIT reply");
	}
	if (v != DPTP_TCPSTORE_WAIT_CANCELED)
		return fail(c, -EPROTO, err, "to CANCEL_WAIT");
	if (arrived)
		return 0;
	return dptp_err_set(err, -ETIMEDOUT, "wait timeout after %lldms, keys: %s",
			    (long long)llround(timeout * 1000.0), names);
}

int dptp_tcpstore_client_wait(struct dptp_tcpstore_client *c, const char *const *keys,
			      size_t n, double timeout, struct dptp_err *err)
{
	return wait_keys(c, keys, n, timeout > 0 ? timeout : c->timeout, err);
}

static int key_frame(struct dptp_tcpstore_client *c, uint8_t op, const char *key,
		     struct dptp_err *err)
{
	DPTP_TRY(begin(c, op, err));
	return w_key(c, key, err);
}

int dptp_tcpstore_client_get(struct dptp_tcpstore_client *c, const char *key,
			     struct dptp_tcpstore_buf *out, struct dptp_err *err)
{
	out->data = NULL;
	out->len = 0;
	DPTP_TRY(wait_keys(c, &key, 1, c->timeout, err));
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_GET, key, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending GET"));
	int rc = recv_buf(c->l->fd, out, RECV_MAX, deadline);
	if (rc < 0)
		return fail(c, rc, err, "reading the GET reply");
	return 0;
}

static int reply_i64(struct dptp_tcpstore_client *c, double deadline, int64_t *v,
		     struct dptp_err *err, const char *what)
{
	uint64_t u = 0;
	int rc = recv_u64(c->l->fd, &u, deadline);
	if (rc < 0)
		return fail(c, rc, err, what);
	if (v)
		*v = (int64_t)u;
	return 0;
}

int dptp_tcpstore_client_add(struct dptp_tcpstore_client *c, const char *key,
			     int64_t delta, int64_t *result, struct dptp_err *err)
{
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_ADD, key, err));
	w_u64(c, (uint64_t)delta);
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending ADD"));
	return reply_i64(c, deadline, result, err, "reading the ADD reply");
}

int dptp_tcpstore_client_add_many(struct dptp_tcpstore_client *c, const char *const *keys,
				  const int64_t *deltas, size_t n, int64_t *results, struct dptp_err *err)
{
	struct dptp_buf all = {0};
	/* one ADD frame per key, sent together, the replies read in order */
	for (size_t i = 0; i < n; i++) {
		int rc = key_frame(c, DPTP_TCPSTORE_ADD, keys[i], err);
		if (rc < 0) {
			dptp_buf_release(&all);
			return rc;
		}
		w_u64(c, (uint64_t)deltas[i]);
		dptp_buf_add(&all, c->w.buf, c->w.len);
	}
	if (all.oom) {
		dptp_buf_release(&all);
		return dptp_err_set(err, -ENOMEM, "tcpstore: out of memory building %zu ADDs", n);
	}
	double deadline = deadline_of(c);
	cur_abort = c->abort_fd;
	int rc = n ? send_all(c->l->fd, all.buf, all.len, deadline) : 0;
	dptp_buf_release(&all);
	if (rc < 0)
		return fail(c, rc, err, "sending ADDs");
	for (size_t i = 0; i < n; i++)
		DPTP_TRY(reply_i64(c, deadline, results ? &results[i] : NULL, err, "reading an ADD reply"));
	return 0;
}

int dptp_tcpstore_client_check(struct dptp_tcpstore_client *c, const char *const *keys,
			       size_t n, bool *ready, struct dptp_err *err)
{
	DPTP_TRY(keys_frame(c, DPTP_TCPSTORE_CHECK, keys, n, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending CHECK"));
	uint8_t v = 0;
	int rc = recv_u8(c->l->fd, &v, deadline);
	if (rc < 0)
		return fail(c, rc, err, "reading the CHECK reply");
	if (v > DPTP_TCPSTORE_NOT_READY)
		return fail(c, -EPROTO, err, "to CHECK");
	if (ready)
		*ready = v == DPTP_TCPSTORE_READY;
	return 0;
}

int dptp_tcpstore_client_compare_set(struct dptp_tcpstore_client *c, const char *key,
				     const void *expected, size_t elen,
				     const void *desired, size_t dlen,
				     struct dptp_tcpstore_buf *current, struct dptp_err *err)
{
	DPTP_TRY(w_value_check(expected, elen, err));
	DPTP_TRY(w_value_check(desired, dlen, err));
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_COMPARE_SET, key, err));
	w_str(c, expected, elen);
	w_str(c, desired, dlen);
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending COMPARE_SET"));
	struct dptp_tcpstore_buf tmp = {0};
	int rc = recv_buf(c->l->fd, &tmp, RECV_MAX, deadline);
	if (rc < 0)
		return fail(c, rc, err, "reading the COMPARE_SET reply");
	if (current)
		*current = tmp;
	else
		free(tmp.data);
	return 0;
}

int dptp_tcpstore_client_delete_key(struct dptp_tcpstore_client *c, const char *key,
				    bool *deleted, struct dptp_err *err)
{
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_DELETE_KEY, key, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending DELETE_KEY"));
	int64_t v = 0;
	DPTP_TRY(reply_i64(c, deadline, &v, err, "reading the DELETE_KEY reply"));
	if (deleted)
		*deleted = v > 0;
	return 0;
}

int dptp_tcpstore_client_multi_get(struct dptp_tcpstore_client *c, const char *const *keys,
				   size_t n, struct dptp_tcpstore_buf **vals,
				   struct dptp_err *err)
{
	*vals = NULL;
	DPTP_TRY(wait_keys(c, keys, n, c->timeout, err));
	DPTP_TRY(keys_frame(c, DPTP_TCPSTORE_MULTI_GET, keys, n, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending MULTI_GET"));
	struct dptp_tcpstore_buf *v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return fail(c, -ENOMEM, err, "for MULTI_GET");
	for (size_t i = 0; i < n; i++) {
		int rc = recv_buf(c->l->fd, &v[i], RECV_MAX, deadline);
		if (rc < 0) {
			dptp_tcpstore_bufs_free(v, i);
			return fail(c, rc, err, "reading the MULTI_GET reply");
		}
	}
	*vals = v;
	return 0;
}

int dptp_tcpstore_client_multi_set(struct dptp_tcpstore_client *c, const char *const *keys,
				   const struct dptp_tcpstore_buf *vals, size_t n,
				   struct dptp_err *err)
{
	if (n > DPTP_TCPSTORE_MAX_KEYS)
		return dptp_err_set(err, -EMSGSIZE, "tcpstore: %zu keys in one request, limit %u",
				    n, DPTP_TCPSTORE_MAX_KEYS);
	for (size_t i = 0; i < n; i++)
		DPTP_TRY(w_value_check(vals[i].data, vals[i].len, err));
	DPTP_TRY(begin(c, DPTP_TCPSTORE_MULTI_SET, err));
	w_u64(c, n);
	for (size_t i = 0; i < n; i++) {
		DPTP_TRY(w_key(c, keys[i], err));
		w_str(c, vals[i].data, vals[i].len);
	}
	return flush(c, deadline_of(c), err, "sending MULTI_SET");
}

int dptp_tcpstore_client_num_keys(struct dptp_tcpstore_client *c, int64_t *n,
				  struct dptp_err *err)
{
	DPTP_TRY(begin(c, DPTP_TCPSTORE_GETNUMKEYS, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending GETNUMKEYS"));
	return reply_i64(c, deadline, n, err, "reading the GETNUMKEYS reply");
}

int dptp_tcpstore_client_queue_pop(struct dptp_tcpstore_client *c, const char *key,
				   bool block, struct dptp_tcpstore_buf *out,
				   struct dptp_err *err)
{
	out->data = NULL;
	out->len = 0;
	if (block)
		DPTP_TRY(wait_keys(c, &key, 1, c->timeout, err));
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_QUEUE_POP, key, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending QUEUE_POP"));
	int64_t size = 0;
	DPTP_TRY(reply_i64(c, deadline, &size, err, "reading the QUEUE_POP reply"));
	if (size == 0)
		return dptp_err_set(err, -EAGAIN, "queue is empty");
	int rc = recv_buf(c->l->fd, out, RECV_MAX, deadline);
	if (rc < 0)
		return fail(c, rc, err, "reading the QUEUE_POP value");
	return 0;
}

int dptp_tcpstore_client_queue_len(struct dptp_tcpstore_client *c, const char *key,
				   int64_t *n, struct dptp_err *err)
{
	DPTP_TRY(key_frame(c, DPTP_TCPSTORE_QUEUE_LEN, key, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending QUEUE_LEN"));
	return reply_i64(c, deadline, n, err, "reading the QUEUE_LEN reply");
}

int dptp_tcpstore_client_list_keys(struct dptp_tcpstore_client *c, char ***keys,
				   size_t *n, struct dptp_err *err)
{
	*keys = NULL;
	*n = 0;
	DPTP_TRY(begin(c, DPTP_TCPSTORE_LIST_KEYS, err));
	double deadline = deadline_of(c);
	DPTP_TRY(flush(c, deadline, err, "sending LIST_KEYS"));
	int64_t count = 0;
	DPTP_TRY(reply_i64(c, deadline, &count, err, "reading the LIST_KEYS reply"));
	if (count < 0 || (uint64_t)count > (uint64_t)1 << 32)
		return fail(c, -EPROTO, err, "to LIST_KEYS (bad count)");
	size_t cap = (size_t)count < 1024 ? (size_t)count : 1024;
	char **out = calloc(cap ? cap : 1, sizeof(*out));
	if (!out)
		return fail(c, -ENOMEM, err, "for LIST_KEYS");
	size_t got = 0;
	for (int64_t i = 0; i < count; i++) {
		struct dptp_tcpstore_buf b = {0};
		int rc = recv_buf(c->l->fd, &b, DPTP_TCPSTORE_MAX_KEY * 16, deadline);
		if (rc < 0) {
			dptp_tcpstore_keys_free(out, got);
			return fail(c, rc, err, "reading the LIST_KEYS reply");
		}
		if (b.len < c->prefix_len || memcmp(b.data, c->prefix, c->prefix_len) != 0) {
			free(b.data);
			continue;
		}
		memmove(b.data, b.data + c->prefix_len, b.len - c->prefix_len + 1);
		if (got == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			char **no = realloc(out, ncap * sizeof(*no));
			if (!no) {
				free(b.data);
				dptp_tcpstore_keys_free(out, got);
				return fail(c, -ENOMEM, err, "for LIST_KEYS");
			}
			out = no;
			cap = ncap;
		}
		out[got++] = (char *)b.data;
	}
	*keys = out;
	*n = got;
	return 0;
}
