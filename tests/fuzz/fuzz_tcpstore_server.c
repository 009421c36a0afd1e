/* libFuzzer: the TCPStore server's request handling (lib/wire/tcpstore_server.c).
 * The server has no entry point that takes raw bytes, so the harness drives
 * a real one over loopback TCP from this thread: it connects, writes the
 * input (after a VALIDATE frame when the first byte's low bit is set, so the
 * fuzzer reaches every opcode), half-closes, and steps the server until it
 * has dropped the connection. Small limits make the limit paths reachable.
 * Invariants: the server never crashes, drops every closed connection, and
 * its buffered byte count returns to zero with no client. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire/tcpstore.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct dptp_tcpstore_server *srv;
static unsigned long runs;

static struct dptp_tcpstore_server *server(void)
{
	/* a fresh store now and then: keys written by earlier inputs must not
	 * grow without bound */
	if (srv && (runs % 2000 == 0 || dptp_tcpstore_server_nkeys(srv) > 5000)) {
		dptp_tcpstore_server_destroy(srv);
		srv = NULL;
	}
	if (!srv) {
		struct dptp_tcpstore_server_opts o = {
			.host = "127.0.0.1",
			.max_client_bytes = 64 * 1024,
			.limits = {.max_key = 256, .max_value = 4096, .max_keys = 64},
		};
		struct dptp_err e = {0};
		if (dptp_tcpstore_server_create(&o, &srv, &e) < 0)
			abort();
	}
	return srv;
}

static void drain(int fd)
{
	char buf[4096];
	while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dptp_tcpstore_server *s = server();
	runs++;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		abort();
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(dptp_tcpstore_server_port(s)),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	/* a connect can fail for the harness's own reasons (ephemeral ports
	 * in TIME_WAIT, a full backlog): let the server accept and try again,
	 * and give up on this input rather than call it a crash */
	int tries = 0;
	while (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (++tries > 100 || (errno != ECONNREFUSED && errno != EAGAIN && errno != EINTR &&
				      errno != EADDRNOTAVAIL && errno != ETIMEDOUT)) {
			close(fd);
			return 0;
		}
		if (dptp_tcpstore_server_step(s, 1, NULL) < 0)
			abort();
		close(fd);
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			abort();
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* RST on close: no TIME_WAIT pile-up */
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	if (dptp_tcpstore_server_step(s, 0, NULL) < 0)
		abort();

	uint8_t validate[5] = {DPTP_TCPSTORE_VALIDATE, 0xCE, 0xF7, 0x85, 0x3C};
	const uint8_t *parts[2] = {validate, size ? data + 1 : data};
	size_t lens[2] = {size && (data[0] & 1) ? sizeof(validate) : 0, size ? size - 1 : 0};
	for (int p = 0; p < 2; p++) {
		size_t off = 0;
		int spins = 0;
		while (off < lens[p] && spins < 1000) {
			ssize_t k = send(fd, parts[p] + off, lens[p] - off, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (k > 0)
				off += (size_t)k;
			else if (k < 0 && errno != EAGAIN && errno != EINTR)
				break; /* the server closed it: fine */
			if (dptp_tcpstore_server_step(s, 0, NULL) < 0)
				abort();
			drain(fd);
			spins++;
		}
	}
	shutdown(fd, SHUT_WR);
	for (int i = 0; i < 1000 && dptp_tcpstore_server_nclients(s) > 0; i++) {
		if (dptp_tcpstore_server_step(s, i < 4 ? 0 : 1, NULL) < 0)
			abort();
		drain(fd);
	}
	close(fd);
	if (dptp_tcpstore_server_nclients(s) != 0)
		__builtin_trap(); /* a half-closed connection was never dropped */
	if (dptp_tcpstore_server_buffered(s) != 0)
		__builtin_trap(); /* buffers of a dropped connection still counted */
	return 0;
}
