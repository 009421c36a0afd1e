/* ipcsock: names, collisions as findings, descriptors with checked senders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "ipc/ipcsock.h"

static uint64_t unique_opid(void)
{
	uint64_t r;
	assert_int_equal(dptp_entropy(&r, sizeof(r)), 0);
	return r;
}

static void test_name(void **state)
{
	char buf[108];
	dptp_ipcsock_name(buf, sizeof(buf), 3, 0xABCDEFULL);
	assert_string_equal(buf, "/tmp/mcastmem-socket-3-abcdef");
}

static void test_collision_is_a_finding(void **state)
{
	uint64_t op = unique_opid();
	struct dptp_ipcsock a, b;
	struct dptp_err err = {0};
	assert_int_equal(dptp_ipcsock_bind(&a, 0, op, &err), 0);
	assert_int_equal(dptp_ipcsock_bind(&b, 0, op, &err), -EADDRINUSE);
	assert_non_null(strstr(err.msg, a.name));
	assert_non_null(strstr(err.msg, "already in use"));
	assert_int_equal(b.fd, -1);
	/* another group rank or opId is another name */
	assert_int_equal(dptp_ipcsock_bind(&b, 1, op, &err), 0);
	dptp_ipcsock_close(&a);
	dptp_ipcsock_close(&b);
	/* the name is free again once closed */
	assert_int_equal(dptp_ipcsock_bind(&a, 0, op, &err), 0);
	dptp_ipcsock_close(&a);
}

/* rx bound as group rank 0, tx as group rank 1 of a fresh opId; *fd a memfd. */
static uint64_t socket_pair(struct dptp_ipcsock *rx, struct dptp_ipcsock *tx, int *fd)
{
	uint64_t op = unique_opid();
	struct dptp_err err = {0};
	assert_int_equal(dptp_ipcsock_bind(rx, 0, op, &err), 0);
	assert_int_equal(dptp_ipcsock_bind(tx, 1, op, &err), 0);
	*fd = memfd_create("t", 0);
	assert_true(*fd >= 0);
	return op;
}

static void test_fd_passing(void **state)
{
	struct dptp_ipcsock rx, tx;
	struct dptp_err err = {0};
	int fd;
	uint64_t op = socket_pair(&rx, &tx, &fd);
	assert_int_equal(write(fd, "rank7", 5), 5);
	struct dptp_ipc_msg m = { .magic = DPTP_IPC_MAGIC, .global_rank = 7, .group_rank = 1, .buffer = 2, .opid = op };
	assert_int_equal(dptp_ipcsock_send(&tx, 0, fd, &m, dptp_now() + 5, &err), 0);
	close(fd);
	struct dptp_ipc_msg got;
	pid_t pid;
	uid_t uid;
	int rfd;
	assert_int_equal(dptp_ipcsock_recv(&rx, &rfd, &got, &pid, &uid, 1.0, &err), 0);
	assert_true(rfd >= 0);
	assert_int_equal(got.global_rank, 7);
	assert_int_equal(got.buffer, 2);
	assert_int_equal(pid, getpid());
	assert_int_equal(uid, getuid());
	char buf[8] = {0};
	assert_int_equal(pread(rfd, buf, 5, 0), 5);
	assert_string_equal(buf, "rank7");
	close(rfd);
	/* nothing more queued */
	assert_int_equal(dptp_ipcsock_recv(&rx, &rfd, &got, &pid, &uid, 0, &err), -EAGAIN);
	/* a name nobody holds */
	assert_true(dptp_ipcsock_send(&tx, 5, 0, &m, dptp_now() + 5, &err) < 0);
	assert_non_null(strstr(err.msg, "sendmsg to '@/tmp/mcastmem-socket-5-"));
	assert_non_null(strstr(err.msg, strerror(ECONNREFUSED)));
	dptp_ipcsock_close(&rx);
	dptp_ipcsock_close(&tx);
}

/* A receiver that never reads (a foreign datagram left in its queue, a
 * stopped peer) must not block its sender for good: the send waits for
 * room until its deadline, then fails naming the socket. */
static void test_full_queue_is_bounded(void **state)
{
	struct dptp_ipcsock rx, tx;
	struct dptp_err err = {0};
	int fd;
	uint64_t op = socket_pair(&rx, &tx, &fd);
	struct dptp_ipc_msg m = { .magic = DPTP_IPC_MAGIC, .global_rank = 1, .group_rank = 1, .opid = op };
	int rc = 0, sent = 0;
	while (sent < 1000 && (rc = dptp_ipcsock_send(&tx, 0, fd, &m, dptp_now() + 0.05, &err)) == 0)
		sent++;
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true(sent >= 1);
	assert_non_null(strstr(err.msg, "its queue stayed full until the deadline"));
	assert_non_null(strstr(err.msg, rx.name));
	close(fd);
	dptp_ipcsock_close(&rx);
	dptp_ipcsock_close(&tx);
}

static void test_sender_pid_is_the_kernels(void **state)
{
	/* a process outside the job claims to be global rank 1: the payload
	 * says 1, the kernel says who really sent it */
	uint64_t op = unique_opid();
	struct dptp_ipcsock rx;
	struct dptp_err err = {0};
	assert_int_equal(dptp_ipcsock_bind(&rx, 0, op, &err), 0);
	pid_t child = fork();
	if (child == 0) {
		struct dptp_ipcsock tx;
		if (dptp_ipcsock_bind(&tx, 1, op, NULL) < 0)
			_exit(1);
		int fd = memfd_create("x", 0);
		struct dptp_ipc_msg m = { .magic = DPTP_IPC_MAGIC, .global_rank = 1, .opid = op };
		_exit(dptp_ipcsock_send(&tx, 0, fd, &m, dptp_now() + 5, NULL) < 0 ? 2 : 0);
	}
	int st;
	assert_int_equal(waitpid(child, &st, 0), child);
	assert_int_equal(WEXITSTATUS(st), 0);
	struct dptp_ipc_msg got;
	pid_t pid;
	uid_t uid;
	int rfd;
	assert_int_equal(dptp_ipcsock_recv(&rx, &rfd, &got, &pid, &uid, 1.0, &err), 0);
	assert_int_equal(got.global_rank, 1);
	assert_int_equal(pid, child);
	assert_int_not_equal(pid, getpid());
	close(rfd);
	dptp_ipcsock_close(&rx);
}

static void test_malformed_datagram(void **state)
{
	uint64_t op = unique_opid();
	struct dptp_ipcsock rx, tx;
	struct dptp_err err = {0};
	assert_int_equal(dptp_ipcsock_bind(&rx, 0, op, &err), 0);
	assert_int_equal(dptp_ipcsock_bind(&tx, 1, op, &err), 0);
	int fd = memfd_create("t", 0);
	struct dptp_ipc_msg m = { .magic = 0x12345678, .global_rank = 1 };
	assert_int_equal(dptp_ipcsock_send(&tx, 0, fd, &m, dptp_now() + 5, &err), 0);
	close(fd);
	struct dptp_ipc_msg got;
	pid_t pid;
	uid_t uid;
	int rfd = 99;
	assert_int_equal(dptp_ipcsock_recv(&rx, &rfd, &got, &pid, &uid, 1.0, &err), -EPROTO);
	assert_int_equal(rfd, -1); /* the descriptor that came with it was closed */
	assert_non_null(strstr(err.msg, "malformed"));
	dptp_ipcsock_close(&rx);
	dptp_ipcsock_close(&tx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_name),
		cmocka_unit_test(test_collision_is_a_finding),
		cmocka_unit_test(test_fd_passing),
		cmocka_unit_test(test_full_queue_is_bounded),
		cmocka_unit_test(test_sender_pid_is_the_kernels),
		cmocka_unit_test(test_malformed_datagram),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
