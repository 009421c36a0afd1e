/* TCPStore: byte-exact replay of PyTorch 2.11 captures in both directions,
 * C client against C server for every op, and hostile input to the server.
 * The traces below are the *_trace_2.11.txt files in tests/data/tcpstore (copied from
 * reference/torchrun-captures): "N> hex" is connection N's request bytes,
 * "N< hex" the server's reply bytes, in the order they crossed the wire. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <grp.h>
#include <unistd.h>

#include "wire/tcpstore.h"

/* tcpstore_ops_trace_2.11.txt */
static const char trace_ops[] =
	"1> 00cef7853c0da1010000\n"
	"1< a1010000\n"
	"1> 040500000000000000696e69742f0100000000000000\n"
	"1< 0100000000000000\n"
	"# c.set('k','v1')\n"
	"1> 0102000000000000002f6b02000000000000007631\n"
	"# c.get('k')\n"
	"1> 06010000000000000002000000000000002f6b\n"
	"1< 00\n"
	"1> 0302000000000000002f6b\n"
	"1< 02000000000000007631\n"
	"# c.add('n',5)\n"
	"1> 0402000000000000002f6e0500000000000000\n"
	"1< 0500000000000000\n"
	"# c.check(['k','q'])\n"
	"1> 05020000000000000002000000000000002f6b02000000000000002f71\n"
	"1< 01\n"
	"# c.compare_set('k','v1','v2')\n"
	"1> 0202000000000000002f6b0200000000000000763102000000000000007632\n"
	"1< 02000000000000007632\n"
	"# c.num_keys()\n"
	"1> 07\n"
	"1< 0300000000000000\n"
	"# c.delete_key('n')\n"
	"1> 0802000000000000002f6e\n"
	"1< 0100000000000000\n"
	"# c.append('k','x')\n"
	"1> 0902000000000000002f6b010000000000000078\n"
	"# c.multi_set(['a'],['b'])\n"
	"1> 0b010000000000000002000000000000002f61010000000000000062\n"
	"# c.multi_get(['k','a'])\n"
	"1> 06020000000000000002000000000000002f6b02000000000000002f61\n"
	"1< 00\n"
	"1> 0a020000000000000002000000000000002f6b02000000000000002f61\n"
	"1< 0300000000000000763278010000000000000062\n"
	"# c.wait(['k'])\n"
	"1> 06010000000000000002000000000000002f6b\n"
	"1< 00\n"
	"# c.wait(['zz'],T(seconds=1))\n"
	"1> 06010000000000000003000000000000002f7a7a\n"
	"1> 0c\n"
	"1< 01\n"
	;

/* nccl_queue_trace_2.11.txt */
static const char trace_nccl_queue[] =
	"1> 00cef7853c0dfb010000\n"
	"1< fb010000\n"
	"1> 040500000000000000696e69742f0100000000000000\n"
	"1< 0100000000000000\n"
	"1> 0116000000000000002f64656661756c745f70672f302f2f637564612f2f308000000000000000a3f2e66ae"
	"d2e637d0200a35bc00002020000000000000000000000000000000000000000000000000000000000000000000"
	"000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
	"0000000000000000000000000000000000000000000000000000000000000000000\n"
	"1> 0501000000000000000f000000000000002f657863657074696f6e5f64756d70\n"
	"1< 01\n"
	"2> 00cef7853c0d1d020000\n"
	"2< 1d020000\n"
	"# c.queue_push('q','ab')\n"
	"2> 0e02000000000000002f7102000000000000006162\n"
	"# c.queue_len('q')\n"
	"2> 1002000000000000002f71\n"
	"2< 0100000000000000\n"
	"# c.queue_pop('q')\n"
	"2> 06010000000000000002000000000000002f71\n"
	"2< 00\n"
	"2> 0f02000000000000002f71\n"
	"2< 010000000000000002000000000000006162\n"
	"# c.queue_pop('q',False)\n"
	"2> 0f02000000000000002f71\n"
	"2< 0000000000000000\n"
	"# c.list_keys()\n"
	"2> 11\n"
	"2< 020000000000000016000000000000002f64656661756c745f70672f302f2f637564612f2f3005000000000"
	"00000696e69742f\n"
	;

/* tcpstore_ops_trace_1.13.txt (capture_legacy.py: torch 1.13, no VALIDATE,
 * queries numbered from SET = 0; connection 4 watches "/w") */
static const char trace_legacy[] =
	"# c.set('k','v1')\n"
	"1> 0002000000000000002f6b02000000000000007631\n"
	"# c.get('k')\n"
	"1> 05010000000000000002000000000000002f6b\n"
	"1< 00\n"
	"1> 0202000000000000002f6b\n"
	"1< 02000000000000007631\n"
	"# c.add('n',5)\n"
	"1> 0302000000000000002f6e0500000000000000\n"
	"1< 0500000000000000\n"
	"# c.add('n',-7)\n"
	"1> 0302000000000000002f6ef9ffffffffffffff\n"
	"1< feffffffffffffff\n"
	"# c.compare_set('k','v1','v2')\n"
	"1> 0102000000000000002f6b0200000000000000763102000000000000007632\n"
	"1< 02000000000000007632\n"
	"# c.compare_set('k','zz','v3')\n"
	"1> 0102000000000000002f6b02000000000000007a7a02000000000000007633\n"
	"1< 02000000000000007632\n"
	"# c.compare_set('fresh','','f')\n"
	"1> 0106000000000000002f66726573680000000000000000010000000000000066\n"
	"1< 010000000000000066\n"
	"# c.compare_set('none','e','d')\n"
	"1> 0105000000000000002f6e6f6e65010000000000000065010000000000000064\n"
	"1< 010000000000000065\n"
	"# c.num_keys()\n"
	"1> 06\n"
	"1< 0300000000000000\n"
	"# c.delete_key('n')\n"
	"1> 0802000000000000002f6e\n"
	"1< 0100000000000000\n"
	"# c.delete_key('n')\n"
	"1> 0802000000000000002f6e\n"
	"1< 0000000000000000\n"
	"# c.wait(['k'])\n"
	"1> 05010000000000000002000000000000002f6b\n"
	"1< 00\n"
	"# c.wait(['zz'],T(seconds=0.5)): times out in the client, no cancel\n"
	"1> 05010000000000000003000000000000002f7a7a\n"
	"# c.get('fresh')\n"
	"1> 05010000000000000006000000000000002f6672657368\n"
	"1< 00\n"
	"1> 0206000000000000002f6672657368\n"
	"1< 010000000000000066\n"
	"# CHECK ['/k','/q']\n"
	"3> 04020000000000000002000000000000002f6b02000000000000002f71\n"
	"3< 01\n"
	"# CHECK ['/k']\n"
	"3> 04010000000000000002000000000000002f6b\n"
	"3< 00\n"
	"# WATCH_KEY '/w' (on a connection of its own)\n"
	"4> 0702000000000000002f77\n"
	"4< 03\n"
	"# WAIT ['/w'] (answered by the SET below)\n"
	"3> 05010000000000000002000000000000002f77\n"
	"# SET '/w'='a': KEY_CREATED\n"
	"3> 0002000000000000002f77010000000000000061\n"
	"4< 0102000000000000002f770000000000000000010000000000000061\n"
	"3< 00\n"
	"# SET '/w'='b': KEY_UPDATED\n"
	"3> 0002000000000000002f77010000000000000062\n"
	"4< 0002000000000000002f77010000000000000061010000000000000062\n"
	"# ADD '/w' on a text value closes the connection: not replayed\n"
	"# COMPARE_SET '/w' 'b' -> 'c': KEY_UPDATED\n"
	"3> 0102000000000000002f77010000000000000062010000000000000063\n"
	"4< 0002000000000000002f77010000000000000062010000000000000063\n"
	"3< 010000000000000063\n"
	"# COMPARE_SET '/w' 'x' -> 'y': no message\n"
	"3> 0102000000000000002f77010000000000000078010000000000000079\n"
	"3< 010000000000000063\n"
	"# DELETE_KEY '/w': KEY_DELETED\n"
	"3> 0802000000000000002f77\n"
	"4< 0202000000000000002f77010000000000000063\n"
	"3< 0100000000000000\n"
	"# ADD '/w' 3: KEY_CREATED\n"
	"3> 0302000000000000002f770300000000000000\n"
	"4< 00000000000000000102000000000000002f770000000000000000010000000000000033\n"
	"3< 0300000000000000\n"
	"# ADD '/w' 4: KEY_UPDATED\n"
	"3> 0302000000000000002f770400000000000000\n"
	"3< 0700000000000000\n"
	"4< 0002000000000000002f77010000000000000033010000000000000037\n"
	"# GETNUMKEYS\n"
	"3> 06\n"
	"3< 0300000000000000\n"
	;

/* The client against torch 1.13's server, its frames as in trace_legacy:
 * the server closes the connection on VALIDATE, the client connects again
 * and speaks the old protocol; a WAIT that times out costs a new connection. */
static const char trace_legacy_client[] =
	"1> 00cef7853c0d45238100\n"
	"2> 06\n"
	"2< 0300000000000000\n"
	"# c.set('k','v1')\n"
	"2> 0002000000000000002f6b02000000000000007631\n"
	"# c.get('k')\n"
	"2> 05010000000000000002000000000000002f6b\n"
	"2< 00\n"
	"2> 0202000000000000002f6b\n"
	"2< 02000000000000007631\n"
	"# c.add('n',-7)\n"
	"2> 0302000000000000002f6ef9ffffffffffffff\n"
	"2< feffffffffffffff\n"
	"# c.wait(['zz'],0.3): no reply; the client connects again\n"
	"2> 05010000000000000003000000000000002f7a7a\n"
	"# c.compare_set('k','v1','v2')\n"
	"3> 0102000000000000002f6b0200000000000000763102000000000000007632\n"
	"3< 02000000000000007632\n"
	"# c.num_keys(), c.delete_key('n'), c.check(['k','q'])\n"
	"3> 06\n"
	"3< 0300000000000000\n"
	"3> 0802000000000000002f6e\n"
	"3< 0100000000000000\n"
	"3> 04020000000000000002000000000000002f6b02000000000000002f71\n"
	"3< 01\n"
	;

/* static_2node_trace_2.11.txt */
static const char trace_static[] =
	"1> 00cef7853c0dcd010000\n"
	"1< cd010000\n"
	"1> 040500000000000000696e69742f0100000000000000\n"
	"1< 0200000000000000\n"
	"1> 011e000000000000002f6e6f6e652f746f726368656c61737469632f726f6c655f696e666f2f31350000000"
	"00000007b22726f6c65223a202264656661756c74222c202272616e6b223a20312c20226c6f63616c5f776f726"
	"c645f73697a65223a20317d06010000000000000023000000000000002f6e6f6e652f746f726368656c6173746"
	"9632f61737369676e65645f72616e6b732f31\n"
	"1< 00\n"
	"1> 0323000000000000002f6e6f6e652f746f726368656c61737469632f61737369676e65645f72616e6b732f3"
	"1\n"
	"1< 0c000000000000005b312c20322c20312c20325d\n"
	"2> 00cef7853c0dea010000\n"
	"2< ea010000\n"
	"2> 040500000000000000696e69742f0100000000000000\n"
	"2< 0300000000000000\n"
	"2> 0117000000000000002f64656661756c745f70672f302f2f6370752f2f302f31aa000000000000000200000"
	"000000000766d88000000000000000200b2d77f000001000000000000000000000000000000002ec50a3b817f0"
	"000730000000000000060456e3000000000b0c5dc2cff7f0000e0a8202b0000000050c4dc2cff7f00002900000"
	"00000000000000000ff7f000000000000000000002f00000000000000d59d123b817f00007300000000000000c"
	"096d257807f0000ffffffffffffffff00000000000000000100000000000000060100000000000000170000000"
	"00000002f64656661756c745f70672f302f2f6370752f2f302f30\n"
	"2< 00\n"
	"2> 06010000000000000017000000000000002f64656661756c745f70672f302f2f6370752f2f302f30\n"
	"2< 00\n"
	"2> 0317000000000000002f64656661756c745f70672f302f2f6370752f2f302f30\n"
	"2< aa000000000000000200000000000000766d8800000000000000020080577f0000010000000000000000a00"
	"1ad8dff7f0000b5c20ab2127f00007300000000000000a0dd3c3000000000b002ad8dff7f0000e008eb2a00000"
	"00014000000ff7f00002900000000000000204b20b2127f000060050000000000002f00000000000000d59d12b"
	"2127f00007300000000000000c096c2ce117f0000ffffffffffffffff00000000000000000100000000000000\n"
	"2> 06010000000000000017000000000000002f64656661756c745f70672f302f2f6370752f2f302f31\n"
	"2< 00\n"
	"2> 06010000000000000017000000000000002f64656661756c745f70672f302f2f6370752f2f302f31\n"
	"2< 00\n"
	"2> 0317000000000000002f64656661756c745f70672f302f2f6370752f2f302f31\n"
	"2< aa000000000000000200000000000000766d88000000000000000200b2d77f0000010000000000000000000"
	"00000000000002ec50a3b817f0000730000000000000060456e3000000000b0c5dc2cff7f0000e0a8202b00000"
	"00050c4dc2cff7f0000290000000000000000000000ff7f000000000000000000002f00000000000000d59d123"
	"b817f00007300000000000000c096d257807f0000ffffffffffffffff00000000000000000100000000000000\n"
	"1> 0433000000000000002f6e6f6e652f746f726368656c61737469632f6167656e742f7465726d696e616c5f7"
	"3746174652f6e756d5f6d656d626572730100000000000000\n"
	"1< 0200000000000000\n"
	"1> 0133000000000000002f6e6f6e652f746f726368656c61737469632f6167656e742f7465726d696e616c5f7"
	"3746174652f6c6173745f6d656d6265720d000000000000003c76616c5f69676e6f7265643e060100000000000"
	"00033000000000000002f6e6f6e652f746f726368656c61737469632f6167656e742f7465726d696e616c5f737"
	"46174652f6c6173745f6d656d626572\n"
	"1< 00\n"
	;

/* ---- trace parsing --------------------------------------------------------- */

struct step {
	int conn;
	bool request; /* '>' client to server */
	uint8_t *bytes;
	size_t len;
};

struct trace {
	struct step steps[64];
	size_t n;
};

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	return c - 'a' + 10;
}

static void trace_parse(const char *text, struct trace *t)
{
	memset(t, 0, sizeof(*t));
	const char *p = text;
	while (*p) {
		const char *eol = strchr(p, '\n');
		assert_non_null(eol);
		if (p[0] >= '0' && p[0] <= '9') {
			assert_true(t->n < DPTP_ARRAY_LEN(t->steps));
			struct step *s = &t->steps[t->n++];
			s->conn = p[0] - '0';
			s->request = p[1] == '>';
			const char *h = p + 3;
			size_t hl = (size_t)(eol - h);
			assert_int_equal(hl % 2, 0);
			s->len = hl / 2;
			s->bytes = malloc(s->len);
			for (size_t i = 0; i < s->len; i++)
				s->bytes[i] = (uint8_t)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
		}
		p = eol + 1;
	}
}

static void trace_free(struct trace *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->steps[i].bytes);
}

/* Finds the k-th (0-based) step of conn in direction dir. */
static const struct step *trace_find(const struct trace *t, int conn, bool request, int k)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->steps[i].conn == conn && t->steps[i].request == request && k-- == 0)
			return &t->steps[i];
	fail_msg("trace step %d of conn %d not found", k, conn);
	return NULL;
}

/* ---- socket helpers --------------------------------------------------------- */

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static int listen_local(uint16_t *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 16), 0);
	socklen_t sl = sizeof(a);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static int connect_local(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* Reads exactly n bytes within ms; returns bytes read (short on EOF/timeout). */
static size_t read_n(int fd, void *buf, size_t n, int ms)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, ms) <= 0)
			break;
		ssize_t k = recv(fd, (uint8_t *)buf + got, n - got, 0);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	return got;
}

static void write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k <= 0)
			return; /* the server may have closed on us: that is what some tests want */
		p += k;
		n -= (size_t)k;
	}
}

/* True when the peer closes the connection within ms (replies are skipped). */
static bool closed_within(int fd, int ms)
{
	double end = dptp_now() + ms / 1000.0;
	static uint8_t buf[256 * 1024];
	while (dptp_now() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t k = recv(fd, buf, sizeof(buf), 0);
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static const uint8_t validate_frame[] = {0x00, 0xce, 0xf7, 0x85, 0x3c};

/* ---- scripted peer: serves one connection of a trace, checking requests -- */

struct peer {
	const struct trace *t;
	int conn;
	int last_conn;  /* connections conn..last_conn, accepted in turn */
	bool refuse_first; /* close the first one after its steps, as torch 1.13 on a VALIDATE */
	int lfd;
	uint16_t port;
	pthread_t th;
	char mismatch[512];
	size_t done;
	size_t total;
};

/* Plays conn's steps on fd; false on a mismatch (in p->mismatch). */
static bool peer_serve(struct peer *p, int fd, int conn)
{
	for (size_t i = 0; i < p->t->n; i++) {
		const struct step *s = &p->t->steps[i];
		if (s->conn != conn)
			continue;
		if (s->request) {
			uint8_t *got = malloc(s->len);
			size_t n = read_n(fd, got, s->len, 5000);
			if (n != s->len || memcmp(got, s->bytes, s->len) != 0) {
				size_t at = 0;
				while (at < n && got[at] == s->bytes[at])
					at++;
				snprintf(p->mismatch, sizeof(p->mismatch),
					 "step %zu: got %zu of %zu bytes, first difference at byte %zu "
					 "(got %02x, want %02x)", i, n, s->len, at,
					 at < n ? got[at] : 0, s->bytes[at]);
				free(got);
				return false;
			}
			free(got);
		} else {
			write_all(fd, s->bytes, s->len);
		}
		p->done++;
	}
	return true;
}

static void *peer_main(void *arg)
{
	struct peer *p = arg;
	int last = p->last_conn ? p->last_conn : p->conn;
	for (int conn = p->conn; conn <= last && !p->mismatch[0]; conn++) {
		int fd = accept(p->lfd, NULL, NULL);
		if (fd < 0) {
			snprintf(p->mismatch, sizeof(p->mismatch), "accept failed");
			return NULL;
		}
		/* nothing more may come before the client closes */
		uint8_t extra;
		if (peer_serve(p, fd, conn) && !(p->refuse_first && conn == p->conn) &&
		    read_n(fd, &extra, 1, 2000) == 1)
			snprintf(p->mismatch, sizeof(p->mismatch), "conn %d: unexpected extra byte %02x", conn, extra);
		close(fd);
	}
	return NULL;
}

/* Serves connections first..last of the trace, accepted in turn. */
static void peer_start_range(struct peer *p, const struct trace *t, int first, int last, bool refuse_first)
{
	memset(p, 0, sizeof(*p));
	p->t = t;
	p->conn = first;
	p->last_conn = last;
	p->refuse_first = refuse_first;
	for (size_t i = 0; i < t->n; i++)
		p->total += t->steps[i].conn >= first && t->steps[i].conn <= last;
	p->lfd = listen_local(&p->port);
	assert_int_equal(pthread_create(&p->th, NULL, peer_main, p), 0);
}

static void peer_start(struct peer *p, const struct trace *t, int conn)
{
	peer_start_range(p, t, conn, conn, false);
}

static void peer_finish(struct peer *p)
{
	pthread_join(p->th, NULL);
	close(p->lfd);
	if (p->mismatch[0])
		fail_msg("conn %d: %s", p->conn, p->mismatch);
	assert_int_equal(p->done, p->total);
}

static struct dptp_tcpstore_client *client_to(uint16_t port, bool add_init, uint32_t nonce)
{
	struct dptp_tcpstore_client_opts o = {.host = "127.0.0.1", .port = port, .timeout = 5,
					      .add_init = add_init, .ping_nonce = nonce};
	struct dptp_tcpstore_client *c = NULL;
	struct dptp_err err = {0};
	int rc = dptp_tcpstore_client_create(&o, &c, &err);
	if (rc < 0)
		fail_msg("client_create: %s", err.msg);
	return c;
}

static void assert_buf(const struct dptp_tcpstore_buf *b, const void *want, size_t len)
{
	assert_int_equal(b->len, len);
	assert_memory_equal(b->data, want, len);
}

#define S(x) x, strlen(x)

/* ---- client side: our requests are the captured bytes --------------------- */

static void test_client_bytes_ops(void **state)
{
	struct trace t;
	trace_parse(trace_ops, &t);
	struct peer p;
	peer_start(&p, &t, 1);
	struct dptp_tcpstore_client *c = client_to(p.port, true, 417);
	struct dptp_err err = {0};
	struct dptp_tcpstore_buf b = {0};
	int64_t v = 0;
	bool ok = true;

	assert_int_equal(dptp_tcpstore_client_init_count(c), 1);
	assert_int_equal(dptp_tcpstore_client_set(c, "k", S("v1"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_get(c, "k", &b, &err), 0);
	assert_buf(&b, "v1", 2);
	free(b.data);
	assert_int_equal(dptp_tcpstore_client_add(c, "n", 5, &v, &err), 0);
	assert_int_equal(v, 5);
	const char *kq[] = {"k", "q"};
	assert_int_equal(dptp_tcpstore_client_check(c, kq, 2, &ok, &err), 0);
	assert_false(ok);
	assert_int_equal(dptp_tcpstore_client_compare_set(c, "k", S("v1"), S("v2"), &b, &err), 0);
	assert_buf(&b, "v2", 2);
	free(b.data);
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &v, &err), 0);
	assert_int_equal(v, 3);
	assert_int_equal(dptp_tcpstore_client_delete_key(c, "n", &ok, &err), 0);
	assert_true(ok);
	assert_int_equal(dptp_tcpstore_client_append(c, "k", S("x"), &err), 0);
	const char *ka[] = {"a"};
	struct dptp_tcpstore_buf vb = {(uint8_t *)"b", 1};
	assert_int_equal(dptp_tcpstore_client_multi_set(c, ka, &vb, 1, &err), 0);
	const char *kka[] = {"k", "a"};
	struct dptp_tcpstore_buf *vals = NULL;
	assert_int_equal(dptp_tcpstore_client_multi_get(c, kka, 2, &vals, &err), 0);
	assert_buf(&vals[0], "v2x", 3);
	assert_buf(&vals[1], "b", 1);
	dptp_tcpstore_bufs_free(vals, 2);
	const char *kk[] = {"k"};
	assert_int_equal(dptp_tcpstore_client_wait(c, kk, 1, 0, &err), 0);
	const char *kzz[] = {"zz"};
	assert_int_equal(dptp_tcpstore_client_wait(c, kzz, 1, 0.2, &err), -ETIMEDOUT);
	assert_string_equal(err.msg, "wait timeout after 200ms, keys: /zz");
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);
	trace_free(&t);
}

static void test_client_bytes_nccl_queue(void **state)
{
	struct trace t;
	trace_parse(trace_nccl_queue, &t);
	struct dptp_err err = {0};

	/* c1: a worker's NCCL process group: the ncclUniqueId under the PG prefixes */
	struct peer p;
	peer_start(&p, &t, 1);
	struct dptp_tcpstore_client *c = client_to(p.port, true, 507);
	const struct step *set = trace_find(&t, 1, true, 2);
	size_t klen = 22; /* "/default_pg/0//cuda//0" */
	const uint8_t *val = set->bytes + 1 + 8 + klen + 8;
	size_t vlen = set->len - (1 + 8 + klen + 8);
	assert_int_equal(vlen, 128);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "default_pg"), 0);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "0/"), 0);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "cuda/"), 0);
	assert_string_equal(dptp_tcpstore_client_get_prefix(c), "/default_pg/0//cuda//");
	assert_int_equal(dptp_tcpstore_client_set(c, "0", val, vlen, &err), 0);
	assert_int_equal(dptp_tcpstore_client_set_prefix(c, "/"), 0);
	const char *ked[] = {"exception_dump"};
	bool ready = true;
	assert_int_equal(dptp_tcpstore_client_check(c, ked, 1, &ready, &err), 0);
	assert_false(ready);
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);

	/* c2: queues and list_keys, a store created without world_size */
	peer_start(&p, &t, 2);
	c = client_to(p.port, false, 541);
	struct dptp_tcpstore_buf b = {0};
	int64_t n = 0;
	assert_int_equal(dptp_tcpstore_client_queue_push(c, "q", S("ab"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_queue_len(c, "q", &n, &err), 0);
	assert_int_equal(n, 1);
	assert_int_equal(dptp_tcpstore_client_queue_pop(c, "q", true, &b, &err), 0);
	assert_buf(&b, "ab", 2);
	free(b.data);
	assert_int_equal(dptp_tcpstore_client_queue_pop(c, "q", false, &b, &err), -EAGAIN);
	assert_string_equal(err.msg, "queue is empty");
	char **keys = NULL;
	size_t nk = 0;
	assert_int_equal(dptp_tcpstore_client_list_keys(c, &keys, &nk, &err), 0);
	assert_int_equal(nk, 1);
	assert_string_equal(keys[0], "default_pg/0//cuda//0");
	dptp_tcpstore_keys_free(keys, nk);
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);
	trace_free(&t);
}

static void test_client_bytes_legacy(void **state)
{
	struct trace t;
	trace_parse(trace_legacy_client, &t);
	struct peer p;
	peer_start_range(&p, &t, 1, 3, true);
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *c = client_to(p.port, false, 0x00812345u);
	assert_true(dptp_tcpstore_client_legacy(c));
	assert_int_equal(dptp_tcpstore_client_set(c, "k", "v1", 2, &err), 0);
	struct dptp_tcpstore_buf b = {0};
	assert_int_equal(dptp_tcpstore_client_get(c, "k", &b, &err), 0);
	assert_buf(&b, "v1", 2);
	free(b.data);
	int64_t v = 0;
	assert_int_equal(dptp_tcpstore_client_add(c, "n", -7, &v, &err), 0);
	assert_int_equal(v, -2);
	/* what torch 1.13 lacks is refused before a byte is sent */
	assert_int_equal(dptp_tcpstore_client_queue_push(c, "q", "x", 1, &err), -ENOTSUP);
	assert_non_null(strstr(err.msg, "QUEUE_PUSH"));
	char **keys = NULL;
	size_t nk = 0;
	assert_int_equal(dptp_tcpstore_client_list_keys(c, &keys, &nk, &err), -ENOTSUP);
	const char *zz[1] = {"zz"};
	assert_int_equal(dptp_tcpstore_client_wait(c, zz, 1, 0.3, &err), -ETIMEDOUT);
	assert_non_null(strstr(err.msg, "wait timeout after 300ms, keys: /zz"));
	assert_int_equal(dptp_tcpstore_client_compare_set(c, "k", "v1", 2, "v2", 2, &b, &err), 0);
	assert_buf(&b, "v2", 2);
	free(b.data);
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &v, &err), 0);
	assert_int_equal(v, 3);
	bool deleted = false, ready = false;
	assert_int_equal(dptp_tcpstore_client_delete_key(c, "n", &deleted, &err), 0);
	assert_true(deleted);
	const char *kq[2] = {"k", "q"};
	assert_int_equal(dptp_tcpstore_client_check(c, kq, 2, &ready, &err), 0);
	assert_false(ready);
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);
	trace_free(&t);
}

static void test_client_bytes_static_rdzv(void **state)
{
	struct trace t;
	trace_parse(trace_static, &t);
	struct dptp_err err = {0};
	struct dptp_tcpstore_buf b = {0};
	int64_t v = 0;

	/* c1: torchrun's agent on node 1 (PrefixStore("none")) */
	struct peer p;
	peer_start(&p, &t, 1);
	struct dptp_tcpstore_client *c = client_to(p.port, true, 461);
	assert_int_equal(dptp_tcpstore_client_init_count(c), 2);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "none"), 0);
	const char *role = "{\"role\": \"default\", \"rank\": 1, \"local_world_size\": 1}";
	assert_int_equal(dptp_tcpstore_client_set(c, "torchelastic/role_info/1", S(role), &err), 0);
	assert_int_equal(dptp_tcpstore_client_get(c, "torchelastic/assigned_ranks/1", &b, &err), 0);
	assert_buf(&b, "[1, 2, 1, 2]", 12);
	free(b.data);
	assert_int_equal(dptp_tcpstore_client_add(c, "torchelastic/agent/terminal_state/num_members",
						  1, &v, &err), 0);
	assert_int_equal(v, 2);
	const char *last = "torchelastic/agent/terminal_state/last_member";
	assert_int_equal(dptp_tcpstore_client_set(c, last, S("<val_ignored>"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_wait(c, &last, 1, 0, &err), 0);
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);

	/* c2: worker rank 1's gloo process group */
	peer_start(&p, &t, 2);
	c = client_to(p.port, true, 490);
	assert_int_equal(dptp_tcpstore_client_init_count(c), 3);
	const struct step *set = trace_find(&t, 2, true, 2);
	size_t klen = 23; /* "/default_pg/0//cpu//0/1" */
	const uint8_t *val = set->bytes + 1 + 8 + klen + 8;
	size_t vlen = 170;
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "default_pg"), 0);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "0/"), 0);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, "cpu/"), 0);
	assert_int_equal(dptp_tcpstore_client_set(c, "0/1", val, vlen, &err), 0);
	for (int r = 0; r < 2; r++) {
		char key[8];
		snprintf(key, sizeof(key), "0/%d", r);
		const char *k = key;
		assert_int_equal(dptp_tcpstore_client_wait(c, &k, 1, 0, &err), 0);
		assert_int_equal(dptp_tcpstore_client_get(c, key, &b, &err), 0);
		assert_int_equal(b.len, 170);
		free(b.data);
	}
	dptp_tcpstore_client_destroy(c);
	peer_finish(&p);
	trace_free(&t);
}

/* ---- server side: our replies are the captured bytes ----------------------- */

static struct dptp_tcpstore_server *server_up(size_t max_client_bytes)
{
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1",
					      .max_client_bytes = max_client_bytes};
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_err err = {0};
	if (dptp_tcpstore_server_create(&o, &s, &err) < 0)
		fail_msg("server_create: %s", err.msg);
	assert_true(dptp_tcpstore_server_port(s) > 0);
	assert_int_equal(dptp_tcpstore_server_start(s, &err), 0);
	return s;
}

/* Sends every request of the trace in order, on one socket per connection,
 * and checks that each reply is byte for byte the captured one. */
static void replay_against_server(const struct trace *t, uint16_t port)
{
	int fds[10];
	for (int i = 0; i < 10; i++)
		fds[i] = -1;
	for (size_t i = 0; i < t->n; i++) {
		const struct step *s = &t->steps[i];
		if (fds[s->conn] < 0)
			fds[s->conn] = connect_local(port);
		if (s->request) {
			write_all(fds[s->conn], s->bytes, s->len);
			continue;
		}
		uint8_t *got = malloc(s->len + 1);
		size_t n = read_n(fds[s->conn], got, s->len, 5000);
		if (n != s->len || memcmp(got, s->bytes, s->len) != 0)
			fail_msg("step %zu (conn %d): reply differs from the capture (%zu of %zu bytes)",
				 i, s->conn, n, s->len);
		free(got);
	}
	/* and nothing else was sent */
	for (int i = 0; i < 10; i++) {
		if (fds[i] < 0)
			continue;
		uint8_t extra;
		assert_int_equal(read_n(fds[i], &extra, 1, 100), 0);
		close(fds[i]);
	}
}

/* A whole trace against a fresh server. */
static void replay_on_new_server(const char *text)
{
	struct trace t;
	trace_parse(text, &t);
	struct dptp_tcpstore_server *s = server_up(0);
	replay_against_server(&t, dptp_tcpstore_server_port(s));
	dptp_tcpstore_server_destroy(s);
	trace_free(&t);
}

static void test_server_bytes_ops(void **state)
{
	replay_on_new_server(trace_ops);
}

static void test_server_bytes_nccl_queue(void **state)
{
	replay_on_new_server(trace_nccl_queue);
}

static void test_server_bytes_legacy(void **state)
{
	replay_on_new_server(trace_legacy);
}

static void test_server_bytes_static_rdzv(void **state)
{
	struct trace t;
	trace_parse(trace_static, &t);
	struct dptp_tcpstore_server *s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	/* what node 0 (its agent and worker 0) wrote, taken from the replies */
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *n0 = client_to(port, true, 0);
	const struct step *ranks = trace_find(&t, 1, false, 3);
	const struct step *blob0 = trace_find(&t, 2, false, 4);
	assert_int_equal(dptp_tcpstore_client_push_prefix(n0, "none"), 0);
	assert_int_equal(dptp_tcpstore_client_set(n0, "torchelastic/assigned_ranks/1",
						  ranks->bytes + 8, ranks->len - 8, &err), 0);
	assert_int_equal(dptp_tcpstore_client_add(n0, "torchelastic/agent/terminal_state/num_members",
						  1, NULL, &err), 0);
	assert_int_equal(dptp_tcpstore_client_set_prefix(n0, "/default_pg/0//cpu//"), 0);
	assert_int_equal(dptp_tcpstore_client_set(n0, "0/0", blob0->bytes + 8, blob0->len - 8, &err), 0);
	int64_t nk = 0;
	assert_int_equal(dptp_tcpstore_client_num_keys(n0, &nk, &err), 0);
	assert_int_equal(nk, 4);
	replay_against_server(&t, port);
	dptp_tcpstore_client_destroy(n0);
	dptp_tcpstore_server_destroy(s);
	trace_free(&t);
}

/* ---- the pure scanner -------------------------------------------------------- */

static void scan_trace(const char *text, bool legacy)
{
	int (*scan)(const void *, size_t, const struct dptp_tcpstore_limits *, size_t *) =
		legacy ? dptp_tcpstore_scan_legacy_request : dptp_tcpstore_scan_request;
	struct trace t;
	trace_parse(text, &t);
	for (size_t i = 0; i < t.n; i++) {
		const struct step *s = &t.steps[i];
		if (!s->request)
			continue;
		/* a line may hold several frames written at once */
		size_t off = 0;
		while (off < s->len) {
			size_t n = 0;
			assert_int_equal(scan(s->bytes + off, s->len - off, NULL, &n), 1);
			assert_true(n > 0 && off + n <= s->len);
			/* every strict prefix asks for more, and for no more than it needs */
			for (size_t k = 0; k < n; k++) {
				size_t need = 0;
				assert_int_equal(scan(s->bytes + off, k, NULL, &need), 0);
				assert_true(need > k && need <= n);
			}
			off += n;
		}
	}
	trace_free(&t);
}

static void test_scan_captured_frames(void **state)
{
	scan_trace(trace_ops, false);
	scan_trace(trace_nccl_queue, false);
	scan_trace(trace_static, false);
	scan_trace(trace_legacy, true);
}

/* Dialects: the first bytes tell them apart; the numbering maps both ways. */
static void test_dialects(void **state)
{
	static const uint8_t legacy_set[] = {0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, '/', 'k', 0, 0, 0, 0, 0, 0, 0, 0};
	assert_int_equal(dptp_tcpstore_dialect_of(validate_frame, 0), DPTP_TCPSTORE_DIALECT_UNKNOWN);
	for (size_t n = 1; n < 5; n++)
		assert_int_equal(dptp_tcpstore_dialect_of(validate_frame, n), DPTP_TCPSTORE_DIALECT_UNKNOWN);
	assert_int_equal(dptp_tcpstore_dialect_of(validate_frame, 5), DPTP_TCPSTORE_DIALECT_CURRENT);
	assert_int_equal(dptp_tcpstore_dialect_of(legacy_set, 2), DPTP_TCPSTORE_DIALECT_LEGACY);
	uint8_t get[] = {DPTP_TCPSTORE_LEGACY_GET};
	assert_int_equal(dptp_tcpstore_dialect_of(get, 1), DPTP_TCPSTORE_DIALECT_LEGACY);
	size_t n = 0;
	assert_int_equal(dptp_tcpstore_scan_legacy_request(legacy_set, sizeof(legacy_set), NULL, &n), 1);
	assert_int_equal(n, sizeof(legacy_set));
	/* the same bytes are a VALIDATE with a wrong magic to a current server */
	assert_int_equal(dptp_tcpstore_scan_request(legacy_set, sizeof(legacy_set), NULL, &n), -EPROTO);
	/* numbering: every legacy op maps to a current one and back */
	for (int op = 0; op < DPTP_TCPSTORE_LEGACY_NOPS; op++) {
		int cur = dptp_tcpstore_op_from_legacy(op);
		assert_true(cur > DPTP_TCPSTORE_VALIDATE);
		assert_int_equal(dptp_tcpstore_op_to_legacy(cur), op);
	}
	assert_int_equal(dptp_tcpstore_op_from_legacy(DPTP_TCPSTORE_LEGACY_WAIT), DPTP_TCPSTORE_WAIT);
	assert_int_equal(dptp_tcpstore_op_from_legacy(DPTP_TCPSTORE_LEGACY_WATCH_KEY), DPTP_TCPSTORE_WATCH_KEY);
	assert_int_equal(dptp_tcpstore_op_from_legacy(DPTP_TCPSTORE_LEGACY_DELETE_KEY), DPTP_TCPSTORE_DELETE_KEY);
	assert_int_equal(dptp_tcpstore_op_from_legacy(DPTP_TCPSTORE_LEGACY_NOPS), -1);
	assert_int_equal(dptp_tcpstore_op_from_legacy(-1), -1);
	assert_int_equal(dptp_tcpstore_op_to_legacy(DPTP_TCPSTORE_PING), -1);
	assert_int_equal(dptp_tcpstore_op_to_legacy(DPTP_TCPSTORE_VALIDATE), -1);
	assert_int_equal(dptp_tcpstore_op_to_legacy(DPTP_TCPSTORE_QUEUE_PUSH), -1);
	/* WATCH_KEY is legacy only; queues, PING and LIST_KEYS current only */
	uint8_t f[16] = {DPTP_TCPSTORE_WATCH_KEY};
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), -EPROTO);
	f[0] = DPTP_TCPSTORE_LEGACY_WATCH_KEY;
	put_u64(f + 1, 1);
	f[9] = 'w';
	assert_int_equal(dptp_tcpstore_scan_legacy_request(f, 10, NULL, &n), 1);
	assert_int_equal(n, 10);
	for (int op = DPTP_TCPSTORE_LEGACY_NOPS; op < 256; op++) {
		f[0] = (uint8_t)op;
		assert_int_equal(dptp_tcpstore_scan_legacy_request(f, 9, NULL, &n), -EPROTO);
	}
	/* limits hold in the legacy numbering too */
	f[0] = DPTP_TCPSTORE_LEGACY_SET;
	put_u64(f + 1, DPTP_TCPSTORE_MAX_KEY + 1);
	assert_int_equal(dptp_tcpstore_scan_legacy_request(f, 9, NULL, &n), -EMSGSIZE);
}

static void test_scan_errors(void **state)
{
	size_t n = 0;
	uint8_t f[64] = {0};
	/* unknown opcode, bad magic */
	f[0] = 18;
	assert_int_equal(dptp_tcpstore_scan_request(f, 1, NULL, &n), -EPROTO);
	f[0] = 0xff;
	assert_int_equal(dptp_tcpstore_scan_request(f, 1, NULL, &n), -EPROTO);
	uint8_t bad[] = {0x00, 0xce, 0xf7, 0x85, 0x3d};
	assert_int_equal(dptp_tcpstore_scan_request(bad, sizeof(bad), NULL, &n), -EPROTO);
	assert_int_equal(dptp_tcpstore_scan_request(validate_frame, 5, NULL, &n), 1);
	assert_int_equal(n, 5);
	/* a huge length prefix is refused from the prefix alone */
	f[0] = DPTP_TCPSTORE_SET;
	put_u64(f + 1, UINT64_MAX);
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), -EMSGSIZE);
	put_u64(f + 1, DPTP_TCPSTORE_MAX_KEY + 1);
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), -EMSGSIZE);
	put_u64(f + 1, DPTP_TCPSTORE_MAX_KEY);
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), 0);
	assert_int_equal(n, 9 + DPTP_TCPSTORE_MAX_KEY);
	/* value over 8 MiB */
	put_u64(f + 1, 1);
	f[9] = 'k';
	put_u64(f + 10, DPTP_TCPSTORE_MAX_VALUE + 1ull);
	assert_int_equal(dptp_tcpstore_scan_request(f, 18, NULL, &n), -EMSGSIZE);
	put_u64(f + 10, DPTP_TCPSTORE_MAX_VALUE);
	assert_int_equal(dptp_tcpstore_scan_request(f, 18, NULL, &n), 0);
	assert_int_equal(n, 18 + DPTP_TCPSTORE_MAX_VALUE);
	/* too many keys */
	f[0] = DPTP_TCPSTORE_WAIT;
	put_u64(f + 1, DPTP_TCPSTORE_MAX_KEYS + 1);
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), -EMSGSIZE);
	f[0] = DPTP_TCPSTORE_MULTI_SET;
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, NULL, &n), -EMSGSIZE);
	/* custom limits */
	struct dptp_tcpstore_limits lim = {.max_key = 4};
	f[0] = DPTP_TCPSTORE_GET;
	put_u64(f + 1, 5);
	assert_int_equal(dptp_tcpstore_scan_request(f, 9, &lim, &n), -EMSGSIZE);
	/* ops without fields */
	f[0] = DPTP_TCPSTORE_GETNUMKEYS;
	assert_int_equal(dptp_tcpstore_scan_request(f, 1, NULL, &n), 1);
	assert_int_equal(n, 1);
	assert_int_equal(dptp_tcpstore_scan_request(f, 0, NULL, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(dptp_tcpstore_op_name(DPTP_TCPSTORE_LIST_KEYS), "LIST_KEYS");
	assert_null(dptp_tcpstore_op_name(DPTP_TCPSTORE_NOPS));
}

/* ---- C client against C server ----------------------------------------------- */

struct waiter {
	struct dptp_tcpstore_client *c;
	const char *key;
	double timeout;
	int rc;
	double seconds;
	pthread_t th;
	int mode; /* 0 wait, 1 get, 2 blocking queue_pop */
	struct dptp_tcpstore_buf got;
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	struct dptp_err err = {0};
	double t0 = dptp_now();
	if (w->mode == 0)
		w->rc = dptp_tcpstore_client_wait(w->c, &w->key, 1, w->timeout, &err);
	else if (w->mode == 1)
		w->rc = dptp_tcpstore_client_get(w->c, w->key, &w->got, &err);
	else
		w->rc = dptp_tcpstore_client_queue_pop(w->c, w->key, true, &w->got, &err);
	w->seconds = dptp_now() - t0;
	return NULL;
}

static void waiter_start(struct waiter *w, struct dptp_tcpstore_client *c, const char *key, int mode)
{
	memset(w, 0, sizeof(*w));
	w->c = c;
	w->key = key;
	w->timeout = 5;
	w->mode = mode;
	w->rc = 1;
	assert_int_equal(pthread_create(&w->th, NULL, waiter_main, w), 0);
	sleep_ms(100); /* let the WAIT reach the server */
}

static void waiter_join(struct waiter *w)
{
	pthread_join(w->th, NULL);
	assert_int_equal(w->rc, 0);
	assert_true(w->seconds >= 0.05 && w->seconds < 4);
}

static void test_c_client_c_server_ops(void **state)
{
	struct dptp_tcpstore_server *s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	struct dptp_tcpstore_client *a = client_to(port, true, 0);
	struct dptp_tcpstore_client *b = client_to(port, true, 0);
	assert_int_equal(dptp_tcpstore_client_init_count(a), 1);
	assert_int_equal(dptp_tcpstore_client_init_count(b), 2);
	struct dptp_err err = {0};
	struct dptp_tcpstore_buf v = {0};
	int64_t n = 0;
	bool flag = false;

	/* SET / GET, GET of a missing key after it appears */
	assert_int_equal(dptp_tcpstore_client_set(a, "k", S("v1"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_get(b, "k", &v, &err), 0);
	assert_buf(&v, "v1", 2);
	assert_int_equal(v.data[2], 0);
	free(v.data);
	/* ADD on a missing and an existing key; the value is ASCII decimal */
	assert_int_equal(dptp_tcpstore_client_add(a, "n", 5, &n, &err), 0);
	assert_int_equal(n, 5);
	assert_int_equal(dptp_tcpstore_client_add(b, "n", -7, &n, &err), 0);
	assert_int_equal(n, -2);
	assert_int_equal(dptp_tcpstore_client_get(a, "n", &v, &err), 0);
	assert_buf(&v, "-2", 2);
	free(v.data);
	/* CHECK */
	const char *kn[] = {"k", "n"}, *kq[] = {"k", "q"};
	assert_int_equal(dptp_tcpstore_client_check(a, kn, 2, &flag, &err), 0);
	assert_true(flag);
	assert_int_equal(dptp_tcpstore_client_check(a, kq, 2, &flag, &err), 0);
	assert_false(flag);
	/* COMPARE_SET: match, mismatch, missing with empty / non-empty expected */
	assert_int_equal(dptp_tcpstore_client_compare_set(a, "k", S("v1"), S("v2"), &v, &err), 0);
	assert_buf(&v, "v2", 2);
	free(v.data);
	assert_int_equal(dptp_tcpstore_client_compare_set(a, "k", S("zz"), S("v3"), &v, &err), 0);
	assert_buf(&v, "v2", 2);
	free(v.data);
	assert_int_equal(dptp_tcpstore_client_compare_set(a, "c", "", 0, S("new"), &v, &err), 0);
	assert_buf(&v, "new", 3);
	free(v.data);
	assert_int_equal(dptp_tcpstore_client_compare_set(a, "d", S("exp"), S("new"), &v, &err), 0);
	assert_buf(&v, "exp", 3);
	free(v.data);
	const char *kd[] = {"d"};
	assert_int_equal(dptp_tcpstore_client_check(a, kd, 1, &flag, &err), 0);
	assert_false(flag);
	/* GETNUMKEYS counts init/, k, n, c */
	assert_int_equal(dptp_tcpstore_client_num_keys(b, &n, &err), 0);
	assert_int_equal(n, 4);
	/* DELETE_KEY */
	assert_int_equal(dptp_tcpstore_client_delete_key(a, "n", &flag, &err), 0);
	assert_true(flag);
	assert_int_equal(dptp_tcpstore_client_delete_key(a, "n", &flag, &err), 0);
	assert_false(flag);
	/* APPEND creates and extends */
	assert_int_equal(dptp_tcpstore_client_append(a, "ap", S("x"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_append(b, "ap", S("yz"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_get(a, "ap", &v, &err), 0);
	assert_buf(&v, "xyz", 3);
	free(v.data);
	/* MULTI_SET / MULTI_GET, including an empty value */
	const char *mk[] = {"m0", "m1", "m2"};
	struct dptp_tcpstore_buf mv[] = {{(uint8_t *)"zero", 4}, {(uint8_t *)"", 0}, {(uint8_t *)"two", 3}};
	assert_int_equal(dptp_tcpstore_client_multi_set(a, mk, mv, 3, &err), 0);
	struct dptp_tcpstore_buf *vals = NULL;
	assert_int_equal(dptp_tcpstore_client_multi_get(b, mk, 3, &vals, &err), 0);
	for (int i = 0; i < 3; i++)
		assert_buf(&vals[i], mv[i].data, mv[i].len);
	dptp_tcpstore_bufs_free(vals, 3);
	/* queues: FIFO, length, empty pop, a non-empty queue satisfies CHECK */
	assert_int_equal(dptp_tcpstore_client_queue_push(a, "q", S("one"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_queue_push(a, "q", S("two"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_queue_len(b, "q", &n, &err), 0);
	assert_int_equal(n, 2);
	assert_int_equal(dptp_tcpstore_client_check(a, kq, 2, &flag, &err), 0);
	assert_true(flag);
	assert_int_equal(dptp_tcpstore_client_queue_pop(b, "q", false, &v, &err), 0);
	assert_buf(&v, "one", 3);
	free(v.data);
	assert_int_equal(dptp_tcpstore_client_queue_pop(b, "q", true, &v, &err), 0);
	assert_buf(&v, "two", 3);
	free(v.data);
	assert_int_equal(dptp_tcpstore_client_queue_pop(b, "q", false, &v, &err), -EAGAIN);
	assert_int_equal(dptp_tcpstore_client_queue_len(b, "q", &n, &err), 0);
	assert_int_equal(n, 0);
	/* the client is still usable after an empty pop */
	assert_int_equal(dptp_tcpstore_client_num_keys(b, &n, &err), 0);
	/* LIST_KEYS with the prefix stripped; init/ is outside "/" */
	char **keys = NULL;
	size_t nk = 0;
	assert_int_equal(dptp_tcpstore_client_list_keys(a, &keys, &nk, &err), 0);
	assert_int_equal(nk, (size_t)n - 1);
	const char *want[] = {"ap", "c", "k", "m0", "m1", "m2"};
	assert_int_equal(nk, DPTP_ARRAY_LEN(want));
	for (size_t i = 0; i < nk; i++)
		assert_string_equal(keys[i], want[i]);
	dptp_tcpstore_keys_free(keys, nk);
	/* PrefixStore: keys under "/job/" only */
	assert_int_equal(dptp_tcpstore_client_push_prefix(b, "job"), 0);
	assert_int_equal(dptp_tcpstore_client_set(b, "x", S("1"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_list_keys(b, &keys, &nk, &err), 0);
	assert_int_equal(nk, 1);
	assert_string_equal(keys[0], "x");
	dptp_tcpstore_keys_free(keys, nk);
	assert_int_equal(dptp_tcpstore_client_get(a, "job/x", &v, &err), 0);
	assert_buf(&v, "1", 1);
	free(v.data);
	/* raw keys: init/ */
	assert_int_equal(dptp_tcpstore_client_set_prefix(b, ""), 0);
	assert_int_equal(dptp_tcpstore_client_get(b, "init/", &v, &err), 0);
	assert_buf(&v, "2", 1);
	free(v.data);
	assert_int_equal(dptp_tcpstore_server_nkeys(s), (size_t)n + 1);

	dptp_tcpstore_client_destroy(a);
	dptp_tcpstore_client_destroy(b);
	dptp_tcpstore_server_destroy(s);
}

static void test_wait_wakeups(void **state)
{
	struct dptp_tcpstore_server *s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	struct dptp_tcpstore_client *w = client_to(port, false, 0);
	struct dptp_tcpstore_client *x = client_to(port, false, 0);
	struct dptp_err err = {0};
	struct waiter th;

	/* every kind of write wakes a pending WAIT */
	waiter_start(&th, w, "by-set", 0);
	assert_int_equal(dptp_tcpstore_client_set(x, "by-set", S("1"), &err), 0);
	waiter_join(&th);
	waiter_start(&th, w, "by-add", 0);
	assert_int_equal(dptp_tcpstore_client_add(x, "by-add", 1, NULL, &err), 0);
	waiter_join(&th);
	waiter_start(&th, w, "by-append", 0);
	assert_int_equal(dptp_tcpstore_client_append(x, "by-append", S("1"), &err), 0);
	waiter_join(&th);
	waiter_start(&th, w, "by-cas", 0);
	assert_int_equal(dptp_tcpstore_client_compare_set(x, "by-cas", "", 0, S("1"), NULL, &err), 0);
	waiter_join(&th);
	waiter_start(&th, w, "by-mset", 0);
	const char *mk[] = {"other", "by-mset"};
	struct dptp_tcpstore_buf mv[] = {{(uint8_t *)"a", 1}, {(uint8_t *)"b", 1}};
	assert_int_equal(dptp_tcpstore_client_multi_set(x, mk, mv, 2, &err), 0);
	waiter_join(&th);
	waiter_start(&th, w, "by-push", 0);
	assert_int_equal(dptp_tcpstore_client_queue_push(x, "by-push", S("1"), &err), 0);
	waiter_join(&th);
	/* get() blocks until the key exists; blocking queue_pop until a push */
	waiter_start(&th, w, "later", 1);
	assert_int_equal(dptp_tcpstore_client_set(x, "later", S("value"), &err), 0);
	waiter_join(&th);
	assert_buf(&th.got, "value", 5);
	free(th.got.data);
	waiter_start(&th, w, "jobs", 2);
	assert_int_equal(dptp_tcpstore_client_queue_push(x, "jobs", S("job1"), &err), 0);
	waiter_join(&th);
	assert_buf(&th.got, "job1", 4);
	free(th.got.data);

	/* WAIT on several keys: answered only when the last one exists */
	const char *two[] = {"p1", "p2"};
	assert_int_equal(dptp_tcpstore_client_set(x, "p1", S("1"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_wait(w, two, 2, 0.2, &err), -ETIMEDOUT);
	assert_string_equal(err.msg, "wait timeout after 200ms, keys: /p1, /p2");

	/* WAIT timeout: CANCEL_WAIT leaves the connection usable and the wait gone */
	const char *never = "never";
	double t0 = dptp_now();
	assert_int_equal(dptp_tcpstore_client_wait(w, &never, 1, 0.3, &err), -ETIMEDOUT);
	assert_true(dptp_now() - t0 >= 0.29 && dptp_now() - t0 < 2);
	assert_int_equal(dptp_tcpstore_client_set(x, "never", S("now"), &err), 0);
	struct dptp_tcpstore_buf v = {0};
	assert_int_equal(dptp_tcpstore_client_get(w, "never", &v, &err), 0);
	assert_buf(&v, "now", 3);
	free(v.data);

	dptp_tcpstore_client_destroy(w);
	dptp_tcpstore_client_destroy(x);
	dptp_tcpstore_server_destroy(s);
}

static void test_disconnect_drops_wait(void **state)
{
	struct dptp_tcpstore_server *s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	size_t base = dptp_tcpstore_server_buffered(s);
	int fd = connect_local(port);
	uint8_t f[64];
	memcpy(f, validate_frame, 5);
	f[5] = DPTP_TCPSTORE_WAIT;
	put_u64(f + 6, 1);
	put_u64(f + 14, 5);
	memcpy(f + 22, "/gone", 5);
	write_all(fd, f, 27);
	sleep_ms(100);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 1);
	close(fd);
	for (int i = 0; i < 50 && dptp_tcpstore_server_nclients(s); i++)
		sleep_ms(20);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 0);
	/* the write that would have woken it finds nobody */
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *c = client_to(port, false, 0);
	assert_int_equal(dptp_tcpstore_client_set(c, "gone", S("1"), &err), 0);
	int64_t n = 0;
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	assert_int_equal(n, 1);
	dptp_tcpstore_client_destroy(c);
	for (int i = 0; i < 50 && dptp_tcpstore_server_nclients(s); i++)
		sleep_ms(20);
	assert_int_equal(dptp_tcpstore_server_buffered(s), base);
	dptp_tcpstore_server_destroy(s);
}

/* ---- hostile input ------------------------------------------------------------------ */

/* A good client still gets served. */
static void assert_serving(uint16_t port)
{
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *c = client_to(port, false, 0);
	int64_t n = -1;
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	assert_true(n >= 0);
	dptp_tcpstore_client_destroy(c);
}

/* ---- both dialects on one server -------------------------------------------- */

/* A legacy frame: op, then fields given as (pointer, length) strings or, with
 * a NULL pointer, a bare u64 length (a count or an ADD delta). */
static size_t legacy_frame(uint8_t *f, uint8_t op, int nfields, ...)
{
	va_list ap;
	size_t off = 0;
	f[off++] = op;
	va_start(ap, nfields);
	for (int i = 0; i < nfields; i++) {
		const char *p = va_arg(ap, const char *);
		size_t n = va_arg(ap, size_t);
		put_u64(f + off, n);
		off += 8;
		if (p) {
			memcpy(f + off, p, n);
			off += n;
		}
	}
	va_end(ap);
	return off;
}

#define F(str) (str), (sizeof(str) - 1)
#define N(n) ((const char *)NULL), ((size_t)(n))

static void send_frame(int fd, const uint8_t *f, size_t n)
{
	write_all(fd, f, n);
}

/* Reads exactly the expected reply bytes. */
static void expect_reply(int fd, const void *want, size_t n)
{
	uint8_t got[256];
	assert_true(n <= sizeof(got));
	assert_int_equal(read_n(fd, got, n, 3000), n);
	assert_memory_equal(got, want, n);
}

/* One watch message: type, key, old, new. */
static void expect_watch(int fd, uint8_t type, const char *k, const char *old, const char *nv)
{
	uint8_t f[256];
	size_t n = legacy_frame(f, type, 3, k, strlen(k), old, strlen(old), nv, strlen(nv));
	expect_reply(fd, f, n);
}

static void expect_quiet(int fd)
{
	uint8_t b;
	assert_int_equal(read_n(fd, &b, 1, 100), 0);
}

static void expect_hangup(uint16_t port, const void *bytes, size_t n, bool validate_first);
static void wait_clients(struct dptp_tcpstore_server *s, size_t want);

static void test_legacy_and_current_together(void **state)
{
	struct dptp_tcpstore_server *s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *cur = client_to(port, true, 0);
	int old = connect_local(port), watch = connect_local(port);
	uint8_t f[256];
	size_t n;
	static const uint8_t ready = DPTP_TCPSTORE_READY, stop = DPTP_TCPSTORE_STOP_WAITING;

	/* a legacy SET arriving a byte at a time: a 0 alone could be a VALIDATE */
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_SET, 2, F("/a"), F("1"));
	for (size_t i = 0; i < n; i++) {
		write_all(old, f + i, 1);
		sleep_ms(i < 3 ? 20 : 0);
	}
	struct dptp_tcpstore_buf b = {0};
	assert_int_equal(dptp_tcpstore_client_get(cur, "a", &b, &err), 0);
	assert_buf(&b, "1", 1);
	free(b.data);
	/* ... and a VALIDATE + PING arriving a byte at a time stays current */
	int v = connect_local(port);
	uint8_t hs[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, DPTP_TCPSTORE_PING, 9, 8, 7, 6};
	for (size_t i = 0; i < sizeof(hs); i++) {
		write_all(v, hs + i, 1);
		sleep_ms(10);
	}
	expect_reply(v, hs + 6, 4);
	close(v);

	/* the watcher registers on its own connection */
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_WATCH_KEY, 1, F("/w"));
	send_frame(watch, f, n);
	uint8_t reg = DPTP_TCPSTORE_KEY_CALLBACK_REGISTERED;
	expect_reply(watch, &reg, 1);
	/* writes by a current client reach the legacy watcher */
	assert_int_equal(dptp_tcpstore_client_set(cur, "w", "x", 1, &err), 0);
	expect_watch(watch, DPTP_TCPSTORE_KEY_CREATED, "/w", "", "x");
	assert_int_equal(dptp_tcpstore_client_append(cur, "w", "yz", 2, &err), 0);
	expect_watch(watch, DPTP_TCPSTORE_KEY_APPENDED, "/w", "", "yz");
	struct dptp_tcpstore_buf mv[1] = {{(uint8_t *)"m", 1}};
	const char *mk[1] = {"w"};
	assert_int_equal(dptp_tcpstore_client_multi_set(cur, mk, mv, 1, &err), 0);
	expect_watch(watch, DPTP_TCPSTORE_KEY_UPDATED, "/w", "xyz", "m");
	/* unchanged by a failed COMPARE_SET: no message */
	assert_int_equal(dptp_tcpstore_client_compare_set(cur, "w", "no", 2, "q", 1, NULL, &err), 0);
	expect_quiet(watch);
	/* the legacy client's own writes too */
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_DELETE_KEY, 1, F("/w"));
	send_frame(old, f, n);
	uint8_t one[8];
	put_u64(one, 1);
	expect_reply(old, one, 8);
	expect_watch(watch, DPTP_TCPSTORE_KEY_DELETED, "/w", "m", "");

	/* 2.1's nightlies before VALIDATE: APPEND .. CANCEL_WAIT */
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_APPEND, 2, F("/a"), F("2"));
	send_frame(old, f, n);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_MULTI_SET, 3, N(1), F("/m"), F("mm"));
	send_frame(old, f, n);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_MULTI_GET, 3, N(2), F("/a"), F("/m"));
	send_frame(old, f, n);
	uint8_t mg[8 + 2 + 8 + 2];
	put_u64(mg, 2);
	memcpy(mg + 8, "12", 2);
	put_u64(mg + 10, 2);
	memcpy(mg + 18, "mm", 2);
	expect_reply(old, mg, sizeof(mg));
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_CHECK, 3, N(2), F("/a"), F("/m"));
	send_frame(old, f, n);
	expect_reply(old, &ready, 1);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_WAIT, 2, N(1), F("/late"));
	send_frame(old, f, n);
	expect_quiet(old);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_CANCEL_WAIT, 0);
	send_frame(old, f, n);
	uint8_t canceled = DPTP_TCPSTORE_WAIT_CANCELED;
	expect_reply(old, &canceled, 1);
	/* a legacy waiter woken by a current client's write */
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_WAIT, 2, N(1), F("/late"));
	send_frame(old, f, n);
	expect_quiet(old);
	assert_int_equal(dptp_tcpstore_client_add(cur, "late", 2, NULL, &err), 0);
	expect_reply(old, &stop, 1);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_ADD, 2, F("/late"), N(3));
	send_frame(old, f, n);
	uint8_t five[8];
	put_u64(five, 5);
	expect_reply(old, five, 8);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_GETNUMKEYS, 0);
	send_frame(old, f, n);
	uint8_t keys[8];
	put_u64(keys, 4); /* init/, /a, /m, /late */
	expect_reply(old, keys, 8);

	/* no queue, PING or VALIDATE in the legacy numbering: the connection closes */
	uint8_t ping = 13;
	expect_hangup(port, &ping, 1, false);
	/* a watcher that leaves takes its watches along; the store goes on */
	close(watch);
	wait_clients(s, 2);
	assert_int_equal(dptp_tcpstore_client_set(cur, "w", "again", 5, &err), 0);
	n = legacy_frame(f, DPTP_TCPSTORE_LEGACY_GET, 1, F("/w"));
	send_frame(old, f, n);
	uint8_t again[8 + 5];
	put_u64(again, 5);
	memcpy(again + 8, "again", 5);
	expect_reply(old, again, sizeof(again));
	close(old);
	dptp_tcpstore_client_destroy(cur);
	dptp_tcpstore_server_destroy(s);
}

/* Opens a connection, sends bytes, expects the server to hang up. */
static void expect_hangup(uint16_t port, const void *bytes, size_t n, bool validate_first)
{
	int fd = connect_local(port);
	if (validate_first)
		write_all(fd, validate_frame, sizeof(validate_frame));
	write_all(fd, bytes, n);
	assert_true(closed_within(fd, 3000));
	close(fd);
}

static void wait_clients(struct dptp_tcpstore_server *s, size_t want)
{
	for (int i = 0; i < 100 && dptp_tcpstore_server_nclients(s) != want; i++)
		sleep_ms(20);
	assert_int_equal(dptp_tcpstore_server_nclients(s), want);
}

static void test_hostile_frames(void **state)
{
	const size_t limit = 1024 * 1024;
	struct dptp_tcpstore_server *s = server_up(limit);
	uint16_t port = dptp_tcpstore_server_port(s);
	uint8_t f[64];
	size_t rejected = 0;

	/* an innocent bystander keeps its connection throughout */
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *good = client_to(port, true, 0);

	/* huge length prefix */
	f[0] = DPTP_TCPSTORE_SET;
	put_u64(f + 1, UINT64_MAX);
	expect_hangup(port, f, 9, true);
	/* value over 8 MiB, refused before its bytes arrive */
	put_u64(f + 1, 1);
	f[9] = 'k';
	put_u64(f + 10, 9u * 1024 * 1024);
	expect_hangup(port, f, 18, true);
	/* a legal value bigger than this server's per-client buffer */
	put_u64(f + 10, 4u * 1024 * 1024);
	expect_hangup(port, f, 18, true);
	/* too many keys */
	f[0] = DPTP_TCPSTORE_WAIT;
	put_u64(f + 1, DPTP_TCPSTORE_MAX_KEYS + 1);
	expect_hangup(port, f, 9, true);
	/* unknown opcode */
	f[0] = 0x42;
	expect_hangup(port, f, 1, true);
	/* VALIDATE twice */
	expect_hangup(port, validate_frame, sizeof(validate_frame), true);
	/* first command is not VALIDATE (a PING) */
	uint8_t ping[] = {DPTP_TCPSTORE_PING, 1, 2, 3, 4};
	expect_hangup(port, ping, sizeof(ping), false);
	/* VALIDATE with the wrong magic: a legacy SET whose key would be 4 GB */
	uint8_t bad[] = {0x00, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0};
	expect_hangup(port, bad, sizeof(bad), false);
	/* garbage */
	uint8_t junk[4096];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < sizeof(junk); i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		junk[i] = (uint8_t)x;
	}
	junk[0] = 0xff;
	expect_hangup(port, junk, sizeof(junk), false);
	expect_hangup(port, junk, sizeof(junk), true);
	/* ADD on a value that is not a number */
	assert_int_equal(dptp_tcpstore_client_set(good, "text", S("abc"), &err), 0);
	uint8_t add[1 + 8 + 5 + 8];
	add[0] = DPTP_TCPSTORE_ADD;
	put_u64(add + 1, 5);
	memcpy(add + 9, "/text", 5);
	put_u64(add + 14, 1);
	expect_hangup(port, add, sizeof(add), true);
	rejected = 11;
	assert_int_equal(dptp_tcpstore_server_nrejected(s), rejected);

	/* truncated frame, then the peer goes away */
	int fd = connect_local(port);
	write_all(fd, validate_frame, 5);
	f[0] = DPTP_TCPSTORE_SET;
	put_u64(f + 1, 3);
	write_all(fd, f, 6); /* 2 of the key's 3 bytes */
	sleep_ms(50);
	assert_serving(port); /* a stalled frame blocks nobody */
	close(fd);

	/* a client that floods requests and never reads its replies */
	uint8_t big[256 * 1024];
	memset(big, 'v', sizeof(big));
	assert_int_equal(dptp_tcpstore_client_set(good, "big", big, sizeof(big), &err), 0);
	fd = connect_local(port);
	write_all(fd, validate_frame, 5);
	uint8_t get[1 + 8 + 4];
	get[0] = DPTP_TCPSTORE_GET;
	put_u64(get + 1, 4);
	memcpy(get + 9, "/big", 4);
	/* 400 x 256 KiB of replies: far more than the kernel's socket buffers
	 * take, so the rest piles up in the server until the limit */
	for (int i = 0; i < 400; i++)
		write_all(fd, get, sizeof(get));
	assert_true(closed_within(fd, 5000));
	close(fd);
	assert_int_equal(dptp_tcpstore_server_nrejected(s), rejected + 1);

	/* many truncated connections at once: memory stays bounded */
	int fds[32];
	for (int i = 0; i < 32; i++) {
		fds[i] = connect_local(port);
		write_all(fds[i], validate_frame, 5);
		f[0] = DPTP_TCPSTORE_SET;
		put_u64(f + 1, 1);
		f[9] = 'k';
		put_u64(f + 10, 512 * 1024);
		write_all(fds[i], f, 18);
		write_all(fds[i], big, 100 * 1024);
	}
	sleep_ms(200);
	assert_true(dptp_tcpstore_server_buffered(s) <= 33 * limit);
	for (int i = 0; i < 32; i++)
		close(fds[i]);
	wait_clients(s, 1);

	/* the bystander was never disturbed, and new clients are served */
	struct dptp_tcpstore_buf v = {0};
	assert_int_equal(dptp_tcpstore_client_get(good, "text", &v, &err), 0);
	assert_buf(&v, "abc", 3);
	free(v.data);
	assert_serving(port);
	wait_clients(s, 1);
	/* what is left is the bystander's buffers, well under one client's limit */
	assert_true(dptp_tcpstore_server_buffered(s) < limit);
	dptp_tcpstore_client_destroy(good);
	wait_clients(s, 0);
	assert_int_equal(dptp_tcpstore_server_buffered(s), 0);
	dptp_tcpstore_server_destroy(s);
}

/* ---- server driven step by step; binding ---------------------------------------- */

static void test_server_step_mode(void **state)
{
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1"};
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_err err = {0};
	assert_int_equal(dptp_tcpstore_server_create(&o, &s, &err), 0);
	int fd = connect_local(dptp_tcpstore_server_port(s));
	/* handshake split across two writes and two steps */
	uint8_t hs[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x0d, 0x78, 0x56, 0x34, 0x12};
	write_all(fd, hs, 7);
	for (int i = 0; i < 5; i++)
		assert_int_equal(dptp_tcpstore_server_step(s, 20, &err), 0);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 1);
	uint8_t echo[4];
	assert_int_equal(read_n(fd, echo, 4, 50), 0);
	write_all(fd, hs + 7, 3);
	for (int i = 0; i < 5; i++)
		assert_int_equal(dptp_tcpstore_server_step(s, 20, &err), 0);
	assert_int_equal(read_n(fd, echo, 4, 500), 4);
	assert_memory_equal(echo, hs + 6, 4);
	close(fd);
	for (int i = 0; i < 5; i++)
		assert_int_equal(dptp_tcpstore_server_step(s, 20, &err), 0);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 0);
	/* it can be started and stopped after being stepped */
	assert_int_equal(dptp_tcpstore_server_start(s, &err), 0);
	assert_serving(dptp_tcpstore_server_port(s));
	dptp_tcpstore_server_stop(s);
	dptp_tcpstore_server_destroy(s);
	dptp_tcpstore_server_destroy(NULL);
	dptp_tcpstore_client_destroy(NULL);
}

/* The descriptors every epoll set of this process holds (/proc/self/fdinfo
 * of each anon_inode:[eventpoll] lists one "tfd:" line per descriptor). */
static int epoll_registrations(void)
{
	int n = 0;
	for (int fd = 0; fd < 1024; fd++) {
		char path[64], target[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		ssize_t k = readlink(path, target, sizeof(target) - 1);
		if (k < 0)
			continue;
		target[k] = '\0';
		if (strcmp(target, "anon_inode:[eventpoll]") != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		char line[256];
		while (fgets(line, sizeof(line), f))
			n += strncmp(line, "tfd:", 4) == 0;
		fclose(f);
	}
	return n;
}

/* A connection that ends while a child (a worker between its vfork and
 * exec) still holds the server's descriptor of it: close() alone left it
 * in the epoll set, which went on reporting the freed connection (ASan: a
 * use after free in dptp_tcpstore_server_step, and the store's host of
 * launcher-c10d-setup_error aborted). */
static void test_server_conn_held_by_child(void **state)
{
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1"};
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_err err = {0};
	assert_int_equal(dptp_tcpstore_server_create(&o, &s, &err), 0);
	assert_int_equal(dptp_tcpstore_server_step(s, 0, &err), 0);
	int base = epoll_registrations();
	int fd = connect_local(dptp_tcpstore_server_port(s));
	for (int i = 0; i < 50 && dptp_tcpstore_server_nclients(s) == 0; i++)
		assert_int_equal(dptp_tcpstore_server_step(s, 20, &err), 0);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 1);
	assert_int_equal(epoll_registrations(), base + 1);
	int hold[2];
	assert_int_equal(pipe(hold), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) { /* holds the server's descriptors until the pipe closes */
		char c;
		close(fd);
		close(hold[1]);
		_exit(read(hold[0], &c, 1) < 0);
	}
	close(hold[0]);
	close(fd);
	for (int i = 0; i < 50 && dptp_tcpstore_server_nclients(s) == 1; i++)
		assert_int_equal(dptp_tcpstore_server_step(s, 20, &err), 0);
	assert_int_equal(dptp_tcpstore_server_nclients(s), 0);
	assert_int_equal(epoll_registrations(), base);
	for (int i = 0; i < 3; i++) /* nothing is reported for it */
		assert_int_equal(dptp_tcpstore_server_step(s, 0, &err), 0);
	close(hold[1]);
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	dptp_tcpstore_server_destroy(s);
}

/* The store shares its process with an agent: at its peak it must leave
 * that agent descriptors for its own files (4096 nodes took 19,938 of
 * 20,000). A child runs the server under RLIMIT_NOFILE 256 while another
 * process opens 300 connections to it: the server accepts up to the limit
 * less its reserve (32 + 256/32), the process can still open files, and
 * the held-back connections are accepted once others close. Exit codes
 * name the step that failed. */
static int fds_scenario(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_max < 512)
		return 0; /* the client's 300 need a hard limit above them */
	struct rlimit low = {.rlim_cur = 256, .rlim_max = rl.rlim_max};
	if (setrlimit(RLIMIT_NOFILE, &low) < 0)
		return 10;
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1"};
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_err err = {0};
	if (dptp_tcpstore_server_create(&o, &s, &err) < 0 || dptp_tcpstore_server_start(s, &err) < 0)
		return 11;
	uint16_t port = dptp_tcpstore_server_port(s);
	int go[2], done[2];
	if (pipe(go) < 0 || pipe(done) < 0)
		return 12;
	pid_t pid = fork();
	if (pid < 0)
		return 13;
	if (pid == 0) { /* 300 connections; closes 120 of them on the first byte, the rest on EOF */
		char c;
		int fds[300];
		setrlimit(RLIMIT_NOFILE, &rl);
		close(go[0]);
		close(done[1]);
		for (int i = 0; i < 300; i++) {
			fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
						.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
			if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&a, sizeof(a)) < 0)
				_exit(2);
		}
		if (write(go[1], "c", 1) != 1 || read(done[0], &c, 1) != 1)
			_exit(3);
		for (int i = 0; i < 120; i++)
			close(fds[i]);
		_exit(read(done[0], &c, 1) < 0 ? 4 : 0);
	}
	close(go[1]);
	close(done[0]);
	char c;
	if (read(go[0], &c, 1) != 1)
		return 14;
	size_t cap = 256 - (32 + 256 / 32), n = 0;
	for (int i = 0; i < 150; i++) { /* until the count stands still for 0.3 s */
		size_t was = n;
		sleep_ms(20);
		n = dptp_tcpstore_server_nclients(s);
		if (n >= cap && n == was && i > 15)
			break;
	}
	int rc = 0;
	int files[16];
	for (int i = 0; i < 16; i++)
		if ((files[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
			rc = rc ? rc : 15; /* the store took the process's last descriptors */
	for (int i = 0; i < 16; i++)
		if (files[i] >= 0)
			close(files[i]);
	if (!rc && (n < cap - 4 || n > cap))
		rc = 16;
	if (!rc && write(done[1], "c", 1) != 1)
		rc = 17;
	for (int i = 0; !rc && i < 250 && dptp_tcpstore_server_nclients(s) != 180; i++)
		sleep_ms(20);
	if (!rc && dptp_tcpstore_server_nclients(s) != 180)
		rc = 18; /* the 60 held back were not accepted once 120 closed */
	close(done[1]);
	int st = 0;
	waitpid(pid, &st, 0);
	dptp_tcpstore_server_destroy(s);
	if (!rc && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		rc = 19;
	return rc;
}

static void test_server_keeps_fds(void **state)
{
	(void)state;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(fds_scenario());
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fail_msg("the descriptor scenario failed at step %d", WEXITSTATUS(st));
}

static bool have_ipv6(void)
{
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	if (fd < 0)
		return false;
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

static void test_bind_addresses(void **state)
{
	struct dptp_err err = {0};
	struct dptp_tcpstore_server *s = NULL;
	/* loopback only: the port is reported and reachable there */
	s = server_up(0);
	uint16_t port = dptp_tcpstore_server_port(s);
	assert_serving(port);
	/* the same port again is refused with a message */
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1", .port = port};
	struct dptp_tcpstore_server *s2 = NULL;
	assert_int_equal(dptp_tcpstore_server_create(&o, &s2, &err), -EADDRINUSE);
	assert_non_null(strstr(err.msg, "cannot listen"));
	assert_null(s2);
	dptp_tcpstore_server_destroy(s);
	/* a bad address */
	o.host = "not-an-address.invalid";
	o.port = 0;
	assert_true(dptp_tcpstore_server_create(&o, &s2, &err) < 0);
	assert_non_null(strstr(err.msg, "tcpstore server: cannot resolve 'not-an-address.invalid': "));
	/* "::" is dual-stack: IPv4 and IPv6 clients both reach it */
	if (!have_ipv6())
		return;
	o.host = "::";
	assert_int_equal(dptp_tcpstore_server_create(&o, &s, &err), 0);
	assert_int_equal(dptp_tcpstore_server_start(s, &err), 0);
	port = dptp_tcpstore_server_port(s);
	assert_serving(port);
	struct dptp_tcpstore_client_opts co = {.host = "::1", .port = port, .timeout = 5};
	struct dptp_tcpstore_client *c = NULL;
	assert_int_equal(dptp_tcpstore_client_create(&co, &c, &err), 0);
	int64_t n = 0;
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	dptp_tcpstore_client_destroy(c);
	dptp_tcpstore_server_destroy(s);
}

struct late_server {
	uint16_t port;
	struct dptp_tcpstore_server *s;
};

static void *late_server_main(void *arg)
{
	struct late_server *l = arg;
	sleep_ms(300);
	struct dptp_tcpstore_server_opts o = {.host = "127.0.0.1", .port = l->port};
	struct dptp_err err = {0};
	if (dptp_tcpstore_server_create(&o, &l->s, &err) == 0)
		dptp_tcpstore_server_start(l->s, &err);
	return NULL;
}

static void test_connect_retry_and_timeout(void **state)
{
	/* find a free port, then leave it closed */
	uint16_t port;
	int fd = listen_local(&port);
	close(fd);
	struct dptp_tcpstore_client_opts o = {.host = "127.0.0.1", .port = port, .timeout = 0.3};
	struct dptp_tcpstore_client *c = NULL;
	struct dptp_err err = {0};
	double t0 = dptp_now();
	int rc = dptp_tcpstore_client_create(&o, &c, &err);
	assert_true(rc == -ECONNREFUSED || rc == -ETIMEDOUT);
	assert_null(c);
	assert_true(dptp_now() - t0 >= 0.25 && dptp_now() - t0 < 2);
	assert_non_null(strstr(err.msg, "cannot connect"));

	/* a server that comes up late is found by the retries */
	struct late_server l = {.port = port};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, late_server_main, &l), 0);
	o.timeout = 5;
	o.add_init = true;
	rc = dptp_tcpstore_client_create(&o, &c, &err);
	pthread_join(th, NULL);
	if (!l.s) {
		dptp_tcpstore_client_destroy(c);
		skip(); /* someone else took the port meanwhile */
	}
	assert_int_equal(rc, 0);
	assert_int_equal(dptp_tcpstore_client_init_count(c), 1);
	/* a server that goes away: calls fail, then say the connection is unusable */
	dptp_tcpstore_server_destroy(l.s);
	int64_t n = 0;
	assert_true(dptp_tcpstore_client_num_keys(c, &n, &err) < 0);
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), -ENOTCONN);
	dptp_tcpstore_client_destroy(c);

	/* not a TCPStore: the PING echo is wrong */
	uint16_t p2;
	int lfd = listen_local(&p2);
	o.port = p2;
	o.timeout = 0.5;
	o.add_init = false;
	pthread_t th2;
	struct trace t;
	trace_parse("1> 00cef7853c0d01000000\n1< 02000000\n", &t);
	struct peer p = {.t = &t, .conn = 1, .lfd = lfd, .port = p2, .total = 2};
	assert_int_equal(pthread_create(&th2, NULL, peer_main, &p), 0);
	o.ping_nonce = 1;
	assert_int_equal(dptp_tcpstore_client_create(&o, &c, &err), -EPROTO);
	pthread_join(th2, NULL);
	close(lfd);
	trace_free(&t);
}

static void test_client_limits(void **state)
{
	struct dptp_tcpstore_server *s = server_up(0);
	struct dptp_tcpstore_client *c = client_to(dptp_tcpstore_server_port(s), false, 0);
	struct dptp_err err = {0};
	char *key = malloc(DPTP_TCPSTORE_MAX_KEY + 1);
	memset(key, 'k', DPTP_TCPSTORE_MAX_KEY);
	key[DPTP_TCPSTORE_MAX_KEY] = 0;
	/* "/" + 8192 bytes is one too many; refused locally, connection intact */
	assert_int_equal(dptp_tcpstore_client_set(c, key, S("v"), &err), -EMSGSIZE);
	key[DPTP_TCPSTORE_MAX_KEY - 1] = 0;
	assert_int_equal(dptp_tcpstore_client_set(c, key, S("v"), &err), 0);
	assert_int_equal(dptp_tcpstore_client_set(c, "v", key, DPTP_TCPSTORE_MAX_VALUE + 1ul, &err),
			 -EMSGSIZE);
	int64_t n = 0;
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	assert_int_equal(n, 1);
	free(key);
	/* an 8 MiB value round-trips */
	uint8_t *big = malloc(DPTP_TCPSTORE_MAX_VALUE);
	for (size_t i = 0; i < DPTP_TCPSTORE_MAX_VALUE; i++)
		big[i] = (uint8_t)(i * 7);
	assert_int_equal(dptp_tcpstore_client_set(c, "big", big, DPTP_TCPSTORE_MAX_VALUE, &err), 0);
	struct dptp_tcpstore_buf v = {0};
	assert_int_equal(dptp_tcpstore_client_get(c, "big", &v, &err), 0);
	assert_buf(&v, big, DPTP_TCPSTORE_MAX_VALUE);
	free(v.data);
	free(big);
	/* push_prefix past the key limit is refused */
	char *p = calloc(1, DPTP_TCPSTORE_MAX_KEY + 2);
	memset(p, 'p', DPTP_TCPSTORE_MAX_KEY + 1);
	assert_int_equal(dptp_tcpstore_client_push_prefix(c, p), -EMSGSIZE);
	assert_string_equal(dptp_tcpstore_client_get_prefix(c), "/");
	free(p);
	dptp_tcpstore_client_destroy(c);
	dptp_tcpstore_server_destroy(s);
}

/* The frame builder: each frame is what the scanner calls one complete
 * request, byte for byte the layout torch sends. */
static void test_frames(void **state)
{
	struct dptp_buf f = {0};
	size_t n = 0;
	dptp_tcpstore_frame_handshake(&f, 0x01020304u);
	static const uint8_t hs[] = { 0, 0xce, 0xf7, 0x85, 0x3c, 13, 4, 3, 2, 1 };
	assert_int_equal(f.len, sizeof(hs));
	assert_memory_equal(f.buf, hs, sizeof(hs));
	assert_int_equal(dptp_tcpstore_scan_request(f.buf, f.len, NULL, &n), 1);
	assert_int_equal(n, 5); /* VALIDATE; PING follows */
	assert_int_equal(dptp_tcpstore_scan_request(f.buf + 5, f.len - 5, NULL, &n), 1);
	assert_int_equal(n, 5);
	f.len = 0;
	dptp_tcpstore_frame_set(&f, "k", "vv", 2);
	static const uint8_t set[] = { 1, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 2, 0, 0, 0, 0, 0, 0, 0, 'v', 'v' };
	assert_int_equal(f.len, sizeof(set));
	assert_memory_equal(f.buf, set, sizeof(set));
	assert_int_equal(dptp_tcpstore_scan_request(f.buf, f.len, NULL, &n), 1);
	assert_int_equal(n, sizeof(set));
	f.len = 0;
	dptp_tcpstore_frame_wait(&f, "key");
	assert_int_equal(dptp_tcpstore_scan_request(f.buf, f.len, NULL, &n), 1);
	assert_int_equal(n, f.len);
	assert_int_equal(f.buf[0], DPTP_TCPSTORE_WAIT);
	assert_int_equal(dptp_le64_get(f.buf + 1), 1);
	assert_int_equal(dptp_le64_get(f.buf + 9), 3);
	assert_false(f.oom);
	uint8_t b[8];
	dptp_le64_put(b, 0x1122334455667788ULL);
	assert_int_equal(b[0], 0x88);
	assert_int_equal(b[7], 0x11);
	dptp_buf_release(&f);
	assert_null(f.buf);
	dptp_buf_release(NULL);
}

/* ---- memory budget (issue 24 item 2) ---------------------------------------------- */

static struct dptp_tcpstore_server *budget_server(const char *host, size_t budget)
{
	struct dptp_tcpstore_server_opts o = {.host = host, .max_total_bytes = budget};
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_err err = {0};
	if (dptp_tcpstore_server_create(&o, &s, &err) < 0)
		fail_msg("server_create: %s", err.msg);
	assert_int_equal(dptp_tcpstore_server_start(s, &err), 0);
	return s;
}

/* The counters are published at the end of each server step. */
static void wait_used(struct dptp_tcpstore_server *s, size_t want)
{
	for (int i = 0; i < 200 && dptp_tcpstore_server_used(s) != want; i++)
		sleep_ms(10);
	assert_int_equal(dptp_tcpstore_server_used(s), want);
}

static void wait_rejected(struct dptp_tcpstore_server *s, size_t want)
{
	for (int i = 0; i < 200 && dptp_tcpstore_server_nrejected(s) < want; i++)
		sleep_ms(10);
	assert_true(dptp_tcpstore_server_nrejected(s) >= want);
}

/* n requests of `op` (SET or QUEUE_PUSH), each under a new 8-byte key with
 * an empty value, from key number `from` on. */
static size_t flood_frames(uint8_t *buf, uint8_t op, unsigned from, unsigned n)
{
	size_t off = 0;
	for (unsigned i = 0; i < n; i++) {
		buf[off] = op;
		put_u64(buf + off + 1, 8);
		snprintf((char *)buf + off + 9, 9, "%c%07x", op == DPTP_TCPSTORE_SET ? 'k' : 'q', from + i);
		put_u64(buf + off + 17, 0);
		off += 25;
	}
	return off;
}

/* Every key, value, queue item and connection is charged at its real cost
 * and given back whole: a store emptied by its clients counts nothing. */
static void test_budget_gives_back(void **state)
{
	struct dptp_tcpstore_server *s = budget_server("127.0.0.1", 64u << 20);
	uint16_t port = dptp_tcpstore_server_port(s);
	struct dptp_err err = {0};
	wait_used(s, 0);
	struct dptp_tcpstore_client *c = client_to(port, false, 0);
	int64_t n;
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	size_t idle = dptp_tcpstore_server_used(s);
	assert_true(idle > 0 && idle < 4096); /* a connection, no buffers */
	char key[32];
	for (int i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		assert_int_equal(dptp_tcpstore_client_set(c, key, S("a value"), &err), 0);
		assert_int_equal(dptp_tcpstore_client_append(c, key, S("+more"), &err), 0);
		snprintf(key, sizeof(key), "q%d", i % 50);
		assert_int_equal(dptp_tcpstore_client_queue_push(c, key, S("item"), &err), 0);
	}
	int64_t sum = 0;
	assert_int_equal(dptp_tcpstore_client_add(c, "counter", 5, &sum, &err), 0);
	struct dptp_tcpstore_buf cur = {0};
	assert_int_equal(dptp_tcpstore_client_compare_set(c, "counter", S("5"), S("a longer value"), &cur, &err), 0);
	free(cur.data);
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	assert_int_equal(n, 201);
	/* at least a struct, a key and a value chunk per key: 200 x 64 */
	assert_true(dptp_tcpstore_server_used(s) > idle + 250 * 64);
	bool deleted;
	for (int i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		assert_int_equal(dptp_tcpstore_client_delete_key(c, key, &deleted, &err), 0);
		assert_true(deleted);
		snprintf(key, sizeof(key), "q%d", i % 50);
		struct dptp_tcpstore_buf v = {0};
		assert_int_equal(dptp_tcpstore_client_queue_pop(c, key, false, &v, &err), 0);
		assert_buf(&v, "item", 4);
		free(v.data);
	}
	assert_int_equal(dptp_tcpstore_client_delete_key(c, "counter", &deleted, &err), 0);
	assert_int_equal(dptp_tcpstore_client_num_keys(c, &n, &err), 0);
	assert_int_equal(n, 0);
	wait_used(s, idle);
	dptp_tcpstore_client_destroy(c);
	wait_used(s, 0);
	dptp_tcpstore_server_destroy(s);
}

/* 8-byte keys with empty values, and queue pushes under new names, cost
 * about 200 bytes each in the heap: the budget stops them at a few
 * thousand, not at budget / 8 (keys) or never (queue names). */
static void test_budget_counts_overhead(void **state)
{
	const size_t budget = 1u << 20;
	static uint8_t buf[4096 * 25];
	for (int op = 0; op < 2; op++) {
		struct dptp_tcpstore_server *s = budget_server("127.0.0.1", budget);
		int fd = connect_local(dptp_tcpstore_server_port(s));
		write_all(fd, validate_frame, sizeof(validate_frame));
		for (unsigned i = 0; i < 64; i++) /* 256 Ki keys: 2 MiB of names */
			write_all(fd, buf, flood_frames(buf, op ? DPTP_TCPSTORE_QUEUE_PUSH : DPTP_TCPSTORE_SET,
							i * 4096, 4096));
		assert_true(closed_within(fd, 5000));
		close(fd);
		wait_rejected(s, 1);
		wait_clients(s, 0);
		assert_true(dptp_tcpstore_server_used(s) <= budget);
		if (!op)
			assert_true(dptp_tcpstore_server_nkeys(s) < budget / 128);
		dptp_tcpstore_server_destroy(s);
	}
}

/* Uid nobody opens 64 connections to s, each sending VALIDATE and `keys`
 * SETs of new 8-byte keys, and keeps them open while this process (the
 * job's own user) waits for `rejected` refusals, checks that nobody holds
 * no more than its eighth of `budget` (connections included) and keeps at
 * most max_conns connections, and sets and gets keys of its own. The child
 * is bounded (alarm, send timeouts). */
static void outsider_run(struct dptp_tcpstore_server *s, size_t budget, unsigned keys, size_t rejected,
			 size_t max_conns)
{
	uint16_t port = dptp_tcpstore_server_port(s);
	int ready[2], done[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(done), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		static uint8_t buf[1024 * 25];
		alarm(30); /* bounded whatever happens to the parent */
		close(done[1]);
		close(ready[0]);
		if (keys > 1024 || setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(2);
		for (unsigned i = 0; i < 64; i++) {
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
						.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
			struct timeval tv = {.tv_sec = 2};
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
			if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
				continue;
			write_all(fd, validate_frame, sizeof(validate_frame));
			write_all(fd, buf, flood_frames(buf, DPTP_TCPSTORE_SET, i * 1024, keys));
		}
		sleep_ms(300);
		char b = 1;
		if (write(ready[1], &b, 1) != 1 || read(done[0], &b, 1) < 0)
			_exit(3);
		_exit(0);
	}
	char b;
	close(ready[1]);
	close(done[0]);
	assert_int_equal(read(ready[0], &b, 1), 1);
	wait_rejected(s, rejected);
	assert_true(dptp_tcpstore_server_used(s) <= budget / 8);
	assert_true(dptp_tcpstore_server_nclients(s) <= max_conns);
	struct dptp_err err = {0};
	struct dptp_tcpstore_client *c = client_to(port, true, 0);
	char key[32];
	for (int i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "rank%d", i);
		assert_int_equal(dptp_tcpstore_client_set(c, key, S("addr:port"), &err), 0);
	}
	struct dptp_tcpstore_buf v = {0};
	assert_int_equal(dptp_tcpstore_client_get(c, "rank999", &v, &err), 0);
	assert_buf(&v, "addr:port", 9);
	free(v.data);
	dptp_tcpstore_client_destroy(c);
	assert_int_equal(write(done[1], &b, 1), 1);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(ready[0]);
	close(done[1]);
}

/* Another user of this host gets an eighth of the budget, however many
 * connections it opens and keeps open (64 x 1024 keys: 512 KiB of names);
 * the job's own user still connects, sets and gets meanwhile. On "::" (dual
 * stack) the IPv4 clients arrive as ::ffff:127.0.0.1. */
static void test_budget_outsider_share(void **state)
{
	if (geteuid() != 0) {
		print_message("skipped: needs root to be another user\n");
		skip();
	}
	const char *hosts[] = {"127.0.0.1", "::"};
	for (int i = 0; i < (have_ipv6() ? 2 : 1); i++) {
		struct dptp_tcpstore_server *s = budget_server(hosts[i], 1u << 20);
		outsider_run(s, 1u << 20, 1024, 1, 64);
		dptp_tcpstore_server_destroy(s);
	}
}

/* With few descriptors (RLIMIT_NOFILE 256) an outsider's idle connection
 * costs its part of them (budget / 256): another user of this host keeps at
 * most 32 of its 64 connections, and the job's own user still gets in. */
static void test_budget_outsider_connections(void **state)
{
	if (geteuid() != 0) {
		print_message("skipped: needs root to be another user\n");
		skip();
	}
	struct rlimit old, low;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	low = old;
	low.rlim_cur = 256;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	struct dptp_tcpstore_server *s = budget_server("127.0.0.1", 1u << 20);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	outsider_run(s, 1u << 20, 0, 32, 32);
	dptp_tcpstore_server_destroy(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scan_captured_frames),
		cmocka_unit_test(test_frames),
		cmocka_unit_test(test_scan_errors),
		cmocka_unit_test(test_client_bytes_ops),
		cmocka_unit_test(test_client_bytes_nccl_queue),
		cmocka_unit_test(test_client_bytes_static_rdzv),
		cmocka_unit_test(test_client_bytes_legacy),
		cmocka_unit_test(test_server_bytes_ops),
		cmocka_unit_test(test_server_bytes_nccl_queue),
		cmocka_unit_test(test_server_bytes_static_rdzv),
		cmocka_unit_test(test_server_bytes_legacy),
		cmocka_unit_test(test_dialects),
		cmocka_unit_test(test_legacy_and_current_together),
		cmocka_unit_test(test_c_client_c_server_ops),
		cmocka_unit_test(test_wait_wakeups),
		cmocka_unit_test(test_disconnect_drops_wait),
		cmocka_unit_test(test_hostile_frames),
		cmocka_unit_test(test_server_step_mode),
		cmocka_unit_test(test_server_conn_held_by_child),
		cmocka_unit_test(test_server_keeps_fds),
		cmocka_unit_test(test_bind_addresses),
		cmocka_unit_test(test_connect_retry_and_timeout),
		cmocka_unit_test(test_client_limits),
		cmocka_unit_test(test_budget_gives_back),
		cmocka_unit_test(test_budget_counts_overhead),
		cmocka_unit_test(test_budget_outsider_share),
		cmocka_unit_test(test_budget_outsider_connections),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
