/* Starting one worker (launcher/agent/spawn.c), with real processes: the
 * vfork child tells the guard its process group before it executes the
 * worker (guard_watch and execve wrapped: the child shares our memory, so
 * what the wrappers record is seen here), in a session of its own; an exec
 * or binding failure comes back as an errno; signals the launcher ignores
 * are the default again in the worker; its output goes where it is told. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/guard.h"
#include "agent/spawn.h"

extern char **environ;

/* what the vfork child did, in order (written by the child, read here) */
static int calls;
static int watch_at, exec_at;
static pid_t watched, watch_pid, watch_sid;

void __wrap_guard_watch(const struct guard *g, pid_t pgid);
void __wrap_guard_watch(const struct guard *g, pid_t pgid)
{
	(void)g;
	watch_at = ++calls;
	watched = pgid;
	watch_pid = getpid();
	watch_sid = getsid(0);
}

int __real_execve(const char *path, char *const argv[], char *const envp[]);
int __wrap_execve(const char *path, char *const argv[], char *const envp[]);
int __wrap_execve(const char *path, char *const argv[], char *const envp[])
{
	exec_at = ++calls;
	return __real_execve(path, argv, envp);
}

static void reset(void)
{
	calls = watch_at = exec_at = 0;
	watched = watch_pid = watch_sid = 0;
}

static int wait_status(pid_t pid)
{
	int st;
	pid_t r;
	while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
		;
	assert_int_equal(r, pid);
	return st;
}

static void test_guard_told_before_exec(void **state)
{
	(void)state;
	struct guard g = {.pid = 0, .fd = -1};
	char *argv[] = {"sh", "-c", "exit 3", NULL};
	struct spawn_req r = {.path = "/bin/sh", .argv = argv, .envp = environ, .stdout_fd = -1, .stderr_fd = -1,
		.guard = &g};
	pid_t pid;
	reset();
	spawn_prepare();
	assert_int_equal(spawn_worker(&r, &pid), 0);
	assert_true(pid > 0);
	/* the child itself named its own group, in a session it leads, and
	 * only then executed the worker */
	assert_int_equal(watched, pid);
	assert_int_equal(watch_pid, pid);
	assert_int_equal(watch_sid, pid);
	assert_true(watch_at > 0);
	assert_true(exec_at > watch_at);
	int st = wait_status(pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 3);
}

static void test_no_guard_no_watch(void **state)
{
	(void)state;
	char *argv[] = {"true", NULL};
	struct spawn_req r = {.path = "/bin/true", .argv = argv, .envp = environ, .stdout_fd = -1, .stderr_fd = -1};
	pid_t pid;
	reset();
	assert_int_equal(spawn_worker(&r, &pid), 0);
	assert_int_equal(watch_at, 0);
	assert_true(exec_at > 0);
	assert_int_equal(WEXITSTATUS(wait_status(pid)), 0);
}

static void test_exec_failure(void **state)
{
	(void)state;
	char *argv[] = {"nothing", NULL};
	struct spawn_req r = {.path = "/nonexistent/dptp-no-such-worker", .argv = argv, .envp = environ,
		.stdout_fd = -1, .stderr_fd = -1};
	pid_t pid = -1;
	reset();
	assert_int_equal(spawn_worker(&r, &pid), -ENOENT);
	/* the child exited 127; the caller reaps it */
	assert_true(pid > 0);
	int st = wait_status(pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 127);
}

static void test_affinity_failure(void **state)
{
	(void)state;
	char *argv[] = {"true", NULL};
	cpu_set_t none;
	CPU_ZERO(&none); /* an empty set: sched_setaffinity says EINVAL */
	struct spawn_req r = {.path = "/bin/true", .argv = argv, .envp = environ, .stdout_fd = -1, .stderr_fd = -1,
		.cpus = &none, .cpus_len = sizeof(none)};
	pid_t pid = -1;
	reset();
	int rc = spawn_worker(&r, &pid);
	assert_true(rc < 0);
	assert_true(-rc & SPAWN_ERR_AFFINITY);
	assert_int_equal(-rc & ~SPAWN_ERR_AFFINITY, EINVAL);
	assert_int_equal(exec_at, 0); /* not executed unbound */
	assert_true(pid > 0);
	assert_int_equal(WEXITSTATUS(wait_status(pid)), 127);
}

/* SIGUSR1 ignored in the launcher is the default again in the worker (it
 * dies of its own kill), and the worker's stdout is the fd it was given. */
static void test_signals_and_stdout(void **state)
{
	(void)state;
	struct sigaction ign = {.sa_handler = SIG_IGN}, old;
	char *argv[] = {"sh", "-c", "echo started; kill -USR1 $$; echo survived", NULL};
	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	struct spawn_req r = {.path = "/bin/sh", .argv = argv, .envp = environ, .stdout_fd = p[1], .stderr_fd = -1};
	pid_t pid;
	assert_int_equal(sigaction(SIGUSR1, &ign, &old), 0);
	spawn_prepare();
	int rc = spawn_worker(&r, &pid);
	assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
	spawn_prepare();
	close(p[1]);
	assert_int_equal(rc, 0);
	char buf[64] = {0};
	size_t got = 0;
	ssize_t n;
	while ((n = read(p[0], buf + got, sizeof(buf) - 1 - got)) > 0)
		got += (size_t)n;
	close(p[0]);
	assert_string_equal(buf, "started\n");
	int st = wait_status(pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGUSR1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_guard_told_before_exec),
		cmocka_unit_test(test_no_guard_no_watch),
		cmocka_unit_test(test_exec_failure),
		cmocka_unit_test(test_affinity_failure),
		cmocka_unit_test(test_signals_and_stdout),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
