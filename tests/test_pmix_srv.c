/* The launcher's PMIx server (launcher/pmix/pmix_srv.c), for real: the
 * OpenPMIx server library in this process (its tmpdir and /dev/shm folder
 * private, removed at the end), clients started from tests/
 * pmix_unit_client.c with the environment pmix_srv_setup_fork gives them.
 *
 * - a job of 3 ranks registered, 2 of them here (the third on a made-up
 *   second node): each client sees its rank, a job of 3 and 2 local ranks;
 *   both are FINALIZED after PMIx_Fence and PMIx_Finalize
 * - a fence reaches the launcher only when every local rank entered it:
 *   with rank 1 held back (it waits for a byte on stdin), no fence reaches
 *   the sink while rank 0 waits in it; once rank 1 is let go, one wildcard
 *   fence arrives, rank 0 still waits in it until the launcher completes
 *   it (as xnode.c does once every node arrived), then both finish
 * - an abnormal end: PMIx_Init, then exit 0 without PMIx_Finalize, is left
 *   as INIT (what supervise.c reports), one that finalized is FINALIZED
 * - PMIx_Abort reaches the sink's abort with the rank, status and message
 * - a job-wide event (PMIx_Notify_event) reaches the sink's notify as a
 *   blob pmix_srv_notify_local takes back (a truncated one it refuses)
 * Every wait is bounded (20 s); clients are reaped, killed if need be. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/env.h"
#include "base/util.h"
#include "pmix/pmix_srv.h"

extern char **environ;

static struct pmix_srv srv;
static char client_path[PATH_MAX];
static unsigned job_no;

struct client {
	pid_t pid;
	int in, out; /* its stdin (write end), its stdout (read end) */
	int status;
	bool done;
};

static struct {
	unsigned fences, aborts, notifies, crashes;
	unsigned char blob[4096];
	size_t blob_len;
	struct pmix_srv_fence *fence; /* taken, to complete as another node's answer would */
	bool wildcard;
	unsigned abort_rank;
	int abort_status;
	char abort_msg[128];
} seen;

static bool on_fence(void *ctx, struct pmix_srv_fence *f)
{
	(void)ctx;
	seen.fences++;
	seen.wildcard = pmix_srv_fence_wildcard(f);
	seen.fence = f;
	return true; /* completed by the test, as xnode.c would once every node arrived */
}

static void on_abort(void *ctx, unsigned rank, int status, const char *msg)
{
	(void)ctx;
	seen.aborts++;
	seen.abort_rank = rank;
	seen.abort_status = status;
	snprintf(seen.abort_msg, sizeof(seen.abort_msg), "%s", msg);
}

static void on_notify(void *ctx, const void *blob, size_t len)
{
	(void)ctx;
	seen.notifies++;
	seen.blob_len = len < sizeof(seen.blob) ? len : 0;
	memcpy(seen.blob, blob, seen.blob_len);
}

static void on_crashed(void *ctx)
{
	(void)ctx;
	seen.crashes++;
}

static struct sigaction guard_action;

static const struct pmix_srv_sink sink = {.fence = on_fence, .abort = on_abort, .notify = on_notify,
	.crashed = on_crashed};

static int setup(void **state)
{
	(void)state;
	struct dptp_err err = {0};
	ssize_t n = readlink("/proc/self/exe", client_path, sizeof(client_path) - 32);
	if (n <= 0)
		return -1;
	client_path[n] = '\0';
	char *slash = strrchr(client_path, '/');
	strcpy(slash + 1, "pmix_unit_client");
	signal(SIGPIPE, SIG_IGN);
	if (pmix_srv_init(&srv, NULL, NULL, &err) < 0) {
		fprintf(stderr, "pmix_srv_init: %s\n", err.msg);
		return -1;
	}
	sigaction(SIGSEGV, NULL, &guard_action); /* cmocka puts its own over it per test */
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char tmpdir[PATH_MAX], shmdir[PATH_MAX];
	struct stat sb;
	snprintf(tmpdir, sizeof(tmpdir), "%s", srv.tmpdir);
	snprintf(shmdir, sizeof(shmdir), "%s", srv.shmdir);
	pmix_srv_finalize(&srv);
	/* nothing left behind */
	if ((tmpdir[0] && stat(tmpdir, &sb) == 0) || (shmdir[0] && stat(shmdir, &sb) == 0)) {
		fprintf(stderr, "left behind: %s %s\n", tmpdir, shmdir);
		return -1;
	}
	return 0;
}

/* A job of n local ranks (0..n-1) and, on a second node, one more: a
 * fence over the whole job then needs the launcher (on one node the library
 * completes it alone). */
static void register_job(unsigned n)
{
	struct dptp_err err = {0};
	char nspace[64];
	struct rdzv_node nodes[2] = {
		{.nproc = n, .base = 0, .slots = 1, .pid = (int)getpid()},
		{.nproc = 1, .base = n, .slots = 1, .pid = 1},
	};
	snprintf(nodes[0].host, sizeof(nodes[0].host), "localhost");
	snprintf(nodes[1].host, sizeof(nodes[1].host), "peer.invalid");
	snprintf(nspace, sizeof(nspace), "dptp-unit.%d.%u", (int)getpid(), job_no++);
	if (pmix_srv_register_job(&srv, nspace, n, 0, n + 1, "localhost", getuid(), getgid(), nodes, 2, 0, &err) < 0)
		fail_msg("register_job: %s", err.msg);
}

static char **env_copy(void)
{
	size_t n = 0;
	while (environ[n])
		n++;
	char **v = calloc(n + 1, sizeof(*v));
	assert_non_null(v);
	for (size_t i = 0; i < n; i++)
		assert_non_null(v[i] = strdup(environ[i]));
	return v;
}

static void start(struct client *c, unsigned rank, const char *mode)
{
	struct dptp_err err = {0};
	char **env = env_copy();
	int in[2], out[2];
	if (pmix_srv_setup_fork(&srv, rank, &env, &err) < 0)
		fail_msg("setup_fork: %s", err.msg);
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	memset(c, 0, sizeof(*c));
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		execle(client_path, "pmix_unit_client", mode, (char *)NULL, env);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	c->in = in[1];
	c->out = out[0];
	pmix_srv_worker_started(&srv, rank, c->pid, client_path);
	env_strv_free(env);
}

/* serves the clients until cond(arg) holds or the bound runs out */
static bool serve_until(struct client *c, size_t n, bool (*cond)(struct client *, size_t), double bound)
{
	double end = dptp_now() + bound;
	while (dptp_now() < end) {
		struct pollfd p = {.fd = pmix_srv_fd(&srv), .events = POLLIN};
		poll(&p, 1, 20);
		pmix_srv_dispatch(&srv, &sink);
		for (size_t i = 0; i < n; i++)
			if (!c[i].done && waitpid(c[i].pid, &c[i].status, WNOHANG) == c[i].pid) {
				c[i].done = true;
				pmix_srv_worker_exited(&srv, (unsigned)i,
					WIFEXITED(c[i].status) ? WEXITSTATUS(c[i].status) : -WTERMSIG(c[i].status));
			}
		if (cond && cond(c, n))
			return true;
	}
	return cond ? cond(c, n) : true;
}

static bool all_done(struct client *c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!c[i].done)
			return false;
	return true;
}

static void finish(struct client *c, size_t n)
{
	if (!serve_until(c, n, all_done, 20.0)) {
		for (size_t i = 0; i < n; i++)
			if (!c[i].done) {
				kill(c[i].pid, SIGKILL);
				waitpid(c[i].pid, &c[i].status, 0);
				c[i].done = true;
			}
	}
	for (size_t i = 0; i < n; i++) {
		close(c[i].in);
		close(c[i].out);
	}
	pmix_srv_dispatch(&srv, &sink);
}

static void expect_line(struct client *c, const char *want)
{
	char buf[128] = {0};
	size_t got = 0;
	double end = dptp_now() + 20.0;
	while (!strchr(buf, '\n') && got < sizeof(buf) - 1 && dptp_now() < end) {
		struct pollfd p = {.fd = c->out, .events = POLLIN};
		if (poll(&p, 1, 20) > 0) {
			ssize_t k = read(c->out, buf + got, 1);
			if (k <= 0)
				break;
			got += (size_t)k;
		}
		/* the client's PMIx_Get waits on the server */
		pmix_srv_dispatch(&srv, &sink);
	}
	assert_string_equal(buf, want);
}

static void exited0(const struct client *c)
{
	assert_true(WIFEXITED(c->status));
	assert_int_equal(WEXITSTATUS(c->status), 0);
}

static void test_job_and_fence(void **state)
{
	(void)state;
	struct client c[2];
	memset(&seen, 0, sizeof(seen));
	register_job(2);
	assert_int_equal(pmix_srv_client_state(&srv, 0), PMIX_SRV_CLIENT_NONE);
	start(&c[0], 0, "fence");
	start(&c[1], 1, "fence-wait");
	expect_line(&c[0], "rank 0 size 3 local 2\n");
	expect_line(&c[1], "rank 1 size 3 local 2\n");
	/* rank 0 is in the fence or on its way; rank 1 is held back */
	serve_until(c, 2, NULL, 0.5);
	assert_int_equal(seen.fences, 0);
	assert_false(c[0].done);
	assert_int_equal(pmix_srv_client_state(&srv, 0), PMIX_SRV_CLIENT_INIT);
	assert_int_equal(write(c[1].in, "g", 1), 1);
	for (int i = 0; i < 1000 && !seen.fence; i++)
		serve_until(c, 2, NULL, 0.02);
	assert_non_null(seen.fence);
	assert_int_equal(seen.fences, 1);
	assert_true(seen.wildcard);
	assert_false(c[0].done); /* still in the fence */
	size_t len = 0;
	const void *data = pmix_srv_fence_data(seen.fence, &len);
	pmix_srv_fence_complete(seen.fence, true, data, len);
	finish(c, 2);
	assert_int_equal(seen.fences, 1);
	exited0(&c[0]);
	exited0(&c[1]);
	assert_int_equal(pmix_srv_client_state(&srv, 0), PMIX_SRV_CLIENT_FINALIZED);
	assert_int_equal(pmix_srv_client_state(&srv, 1), PMIX_SRV_CLIENT_FINALIZED);
	pmix_srv_deregister_job(&srv);
}

static void test_exit_without_finalize(void **state)
{
	(void)state;
	struct client c[1];
	memset(&seen, 0, sizeof(seen));
	register_job(1);
	start(&c[0], 0, "nofinalize");
	expect_line(&c[0], "rank 0 size 2 local 1\n");
	finish(c, 1);
	exited0(&c[0]);
	assert_int_equal(pmix_srv_client_state(&srv, 0), PMIX_SRV_CLIENT_INIT);
	assert_int_equal(seen.fences, 0);
	pmix_srv_deregister_job(&srv);
}

static void test_abort(void **state)
{
	(void)state;
	struct client c[2];
	memset(&seen, 0, sizeof(seen));
	register_job(2);
	start(&c[0], 0, "fence-wait"); /* a bystander, let go at the end */
	start(&c[1], 1, "abort");
	expect_line(&c[1], "rank 1 size 3 local 2\n");
	bool aborted = false;
	for (int i = 0; i < 1000 && !aborted; i++) {
		serve_until(c, 2, NULL, 0.02);
		aborted = seen.aborts > 0;
	}
	/* as the launcher does on an abort: the job is stopped */
	pmix_srv_release_client(&srv, 0);
	pmix_srv_release_client(&srv, 1);
	struct dptp_err err = {0};
	pmix_srv_wait_released(&srv, 5.0, &err);
	kill(c[0].pid, SIGKILL);
	kill(c[1].pid, SIGKILL);
	finish(c, 2);
	assert_true(aborted);
	assert_int_equal(seen.aborts, 1);
	assert_int_equal(seen.abort_rank, 1);
	assert_int_equal(seen.abort_status, 7);
	assert_string_equal(seen.abort_msg, "unit abort");
	pmix_srv_deregister_job(&srv);
}

/* A job-wide event from a local client goes to the sink (for the other
 * nodes) as a blob that pmix_srv_notify_local, another node's side, takes;
 * a truncated one it refuses. */
static void test_event(void **state)
{
	(void)state;
	struct client c[1];
	memset(&seen, 0, sizeof(seen));
	register_job(1);
	start(&c[0], 0, "notify");
	expect_line(&c[0], "rank 0 size 2 local 1\n");
	for (int i = 0; i < 1000 && !seen.notifies; i++)
		serve_until(c, 1, NULL, 0.02);
	finish(c, 1);
	exited0(&c[0]);
	assert_int_equal(seen.notifies, 1);
	assert_true(seen.blob_len > 0);
	assert_int_equal(pmix_srv_notify_local(&srv, seen.blob, seen.blob_len), 0);
	assert_true(pmix_srv_notify_local(&srv, seen.blob, seen.blob_len / 2) < 0);
	pmix_srv_deregister_job(&srv);
}

/* A fault inside libevent on a thread of the library's kind, as OpenPMIx's
 * second completion of a fence does (event_del on the freed tracker's
 * event, whose memory MALLOC_PERTURB_ had filled): a real SIGSEGV in
 * libevent's code, not a simulated one. */
static void *fault_in_libevent(void *freed)
{
	int (*del)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "event_del");
	if (del)
		del(freed);
	return NULL;
}

static bool crashed(struct client *c, size_t n)
{
	(void)c;
	(void)n;
	return seen.crashes > 0;
}

/* The library crashing in its own thread (pmix/crash_guard.h): the process
 * lives on, the sink hears of it once, and with a client still registered
 * every later call returns at once without the library (its locks may be
 * held by the stopped thread). Runs last: the library is gone after it. */
static void test_library_crash(void **state)
{
	(void)state;
	static unsigned char freed[1024];
	struct client c[1];
	struct dptp_err err = {0};
	pthread_t t;
	memset(&seen, 0, sizeof(seen));
	register_job(1);
	start(&c[0], 0, "fence-wait");
	expect_line(&c[0], "rank 0 size 2 local 1\n");
	memset(freed, 0x5a, sizeof(freed));
	assert_non_null(dlsym(RTLD_DEFAULT, "event_del"));
	sigaction(SIGSEGV, &guard_action, NULL);
	assert_int_equal(pthread_create(&t, NULL, fault_in_libevent, freed), 0);
	pthread_detach(t);
	assert_true(serve_until(c, 1, crashed, 20.0));
	assert_int_equal(seen.crashes, 1);
	/* no deregistration goes to the library, so none is waited for (the
	 * library's answer would never come: -ETIMEDOUT after 30 s) */
	pmix_srv_release_client(&srv, 0);
	assert_int_equal(pmix_srv_wait_released(&srv, 30.0, &err), 0);
	kill(c[0].pid, SIGKILL);
	finish(c, 1);
	pmix_srv_deregister_job(&srv);
	assert_int_equal(seen.crashes, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_job_and_fence),
		cmocka_unit_test(test_exit_without_finalize),
		cmocka_unit_test(test_abort),
		cmocka_unit_test(test_event),
		cmocka_unit_test(test_library_crash),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
