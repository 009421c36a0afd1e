/* The worker guard (launcher/agent/guard.c), with real processes: a group
 * it was told of is killed when the launcher dies (the write end of its
 * pipe closes without a word: here the test closes it), a forgotten one is
 * not, a normal end (guard_stop) kills nothing; the directories it was
 * given go with a dead launcher only; a stopped guard (SIGSTOP) holds
 * nothing up: guard_stop kills it, a record that finds its pipe full ends
 * it. Each wait is bounded: a guard that does not act fails the test
 * instead of hanging it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/guard.h"

/* A stand-in worker: the leader of a process group of its own that sleeps
 * (as spawn.c makes one, without its session). */
static pid_t start_group(void)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		setpgid(0, 0);
		execl("/bin/sleep", "sleep", "60", (char *)NULL);
		_exit(127);
	}
	setpgid(pid, pid); /* either side may be first */
	return pid;
}

/* waitpid with a bound of about 10 s: 0 when pid ended (status in *st),
 * -1 when it still runs then. */
static int wait_bounded(pid_t pid, int *st)
{
	for (int i = 0; i < 1000; i++) {
		pid_t r = waitpid(pid, st, WNOHANG);
		if (r == pid)
			return 0;
		if (r < 0 && errno != EINTR)
			return -1;
		nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
	}
	return -1;
}

static void end_group(pid_t pid)
{
	int st;
	kill(-pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
}

/* the launcher dies: what the guard's pipe sees is EOF */
static void die_like_launcher(struct guard *g)
{
	int st = -1;
	close(g->fd);
	g->fd = -1;
	assert_int_equal(wait_bounded(g->pid, &st), 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	g->pid = 0;
}

static void test_watched_group_killed(void **state)
{
	(void)state;
	struct guard g;
	int st = 0;
	assert_int_equal(guard_start(&g), 0);
	assert_true(g.pid > 0);
	pid_t a = start_group(), b = start_group();
	guard_watch(&g, a);
	guard_watch(&g, b);
	die_like_launcher(&g);
	if (wait_bounded(a, &st) < 0) {
		end_group(a);
		end_group(b);
		fail_msg("a watched group outlived the launcher");
	}
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);
	assert_int_equal(wait_bounded(b, &st), 0);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);
}

static void test_forgotten_group_left(void **state)
{
	(void)state;
	struct guard g;
	int st;
	assert_int_equal(guard_start(&g), 0);
	pid_t a = start_group(), b = start_group();
	guard_watch(&g, a);
	guard_watch(&g, b);
	guard_forget(&g, a); /* a was reaped by the launcher: its pid may be anyone's now */
	die_like_launcher(&g); /* the guard has done its killing when it exits */
	bool a_alive = waitpid(a, &st, WNOHANG) == 0;
	end_group(a);
	assert_true(a_alive);
	assert_int_equal(wait_bounded(b, &st), 0);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGKILL);
}

static void test_normal_end_kills_nothing(void **state)
{
	(void)state;
	struct guard g;
	int st;
	assert_int_equal(guard_start(&g), 0);
	pid_t a = start_group();
	guard_watch(&g, a);
	guard_stop(&g); /* reaps the guard */
	assert_int_equal(g.pid, 0);
	assert_int_equal(g.fd, -1);
	bool a_alive = waitpid(a, &st, WNOHANG) == 0;
	end_group(a);
	assert_true(a_alive);
}

static char *make_tree(void)
{
	char tmpl[] = "/tmp/dptp-test-guard-XXXXXX", path[256];
	char *dir = mkdtemp(tmpl);
	assert_non_null(dir);
	snprintf(path, sizeof(path), "%s/sub", dir);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/sub/file", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	close(fd);
	return strdup(dir);
}

static void rm_tree(const char *dir)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/sub/file", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/sub", dir);
	rmdir(path);
	rmdir(dir);
}

static void test_dirs_removed_when_launcher_dies(void **state)
{
	(void)state;
	struct guard g;
	struct stat sb;
	char *d1 = make_tree(), *d2 = make_tree();
	assert_int_equal(guard_start(&g), 0);
	guard_remove_dir(&g, d1);
	guard_remove_dir(&g, d2);
	die_like_launcher(&g);
	bool gone1 = stat(d1, &sb) < 0 && errno == ENOENT;
	bool gone2 = stat(d2, &sb) < 0 && errno == ENOENT;
	rm_tree(d1);
	rm_tree(d2);
	free(d1);
	free(d2);
	assert_true(gone1);
	assert_true(gone2);
}

static void test_dirs_kept_on_normal_end(void **state)
{
	(void)state;
	struct guard g;
	struct stat sb;
	char *d = make_tree();
	assert_int_equal(guard_start(&g), 0);
	guard_remove_dir(&g, d);
	guard_stop(&g); /* the launcher removes them itself then */
	bool kept = stat(d, &sb) == 0;
	rm_tree(d);
	free(d);
	assert_true(kept);
}

/* SIGSTOP, seen through waitpid's WUNTRACED, within about 10 s */
static void stop_guard(pid_t guard)
{
	int st = 0;
	assert_int_equal(kill(guard, SIGSTOP), 0);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(guard, &st, WUNTRACED | WNOHANG) == guard && WIFSTOPPED(st))
			return;
		nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
	}
	fail_msg("the guard did not stop");
}

/* What the launcher would wait on forever (a stopped guard) is bounded
 * here by 30 s: then the guard is killed, which ends that wait, and the
 * test fails instead of hanging. */
static volatile sig_atomic_t overdue;
static pid_t stopped_guard;
static void on_alarm(int sig)
{
	(void)sig;
	overdue = 1;
	kill(stopped_guard, SIGKILL);
}

static void arm(pid_t guard)
{
	struct sigaction sa = {.sa_handler = on_alarm};
	overdue = 0;
	stopped_guard = guard;
	sigaction(SIGALRM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* as the launcher: a dead guard's pipe says EPIPE */
	alarm(30);
}

/* stderr goes to a temporary file until taken back */
static int err_saved = -1;
static FILE *err_file;
static void err_catch(void)
{
	fflush(stderr);
	err_file = tmpfile();
	assert_non_null(err_file);
	err_saved = dup(STDERR_FILENO);
	assert_true(err_saved >= 0);
	assert_true(dup2(fileno(err_file), STDERR_FILENO) >= 0);
}

static void err_take(char *buf, size_t len)
{
	fflush(stderr);
	dup2(err_saved, STDERR_FILENO);
	close(err_saved);
	rewind(err_file);
	size_t k = fread(buf, 1, len - 1, err_file);
	buf[k] = '\0';
	fclose(err_file);
}

/* the guard's pid is no child of ours any more: reaped */
static bool reaped(pid_t pid)
{
	return waitpid(pid, NULL, WNOHANG) < 0 && errno == ECHILD;
}

static void test_stopped_guard_killed_at_stop(void **state)
{
	(void)state;
	struct guard g;
	struct stat sb;
	char out[1024], want[160];
	int st;
	char *d = make_tree();
	assert_int_equal(guard_start(&g), 0);
	pid_t guard = g.pid, a = start_group();
	guard_watch(&g, a);
	guard_remove_dir(&g, d);
	stop_guard(guard);
	guard_forget(&g, a); /* records still go while the guard is stopped */
	guard_watch(&g, a);
	arm(guard);
	err_catch();
	guard_stop(&g);
	err_take(out, sizeof(out));
	alarm(0);
	bool a_alive = waitpid(a, &st, WNOHANG) == 0, kept = stat(d, &sb) == 0, gone = reaped(guard);
	end_group(a);
	rm_tree(d);
	free(d);
	assert_false(overdue);
	assert_int_equal(g.pid, 0);
	assert_int_equal(g.fd, -1);
	assert_true(gone);
	/* a normal end still: nothing killed, nothing removed */
	assert_true(a_alive);
	assert_true(kept);
	snprintf(want, sizeof(want),
		 "dptp-run: warning: the guard (pid %d) did not exit within 2 s of the job's end; killed it\n", (int)guard);
	assert_string_equal(out, want);
}

static void test_full_pipe_ends_stopped_guard(void **state)
{
	(void)state;
	struct guard g;
	char out[1024], want[200];
	int st;
	long sent = 0;
	assert_int_equal(guard_start(&g), 0);
	pid_t guard = g.pid, a = start_group();
	guard_watch(&g, a);
	stop_guard(guard);
	arm(guard);
	err_catch();
	/* 8-byte records: a 64 KiB pipe is full after 8192 */
	for (; sent < 1L << 17 && g.fd >= 0; sent++)
		guard_forget(&g, 1 << 30);
	err_take(out, sizeof(out));
	alarm(0);
	bool a_alive = waitpid(a, &st, WNOHANG) == 0, gone = reaped(guard);
	guard_stop(&g); /* nothing left to stop */
	end_group(a);
	assert_false(overdue);
	assert_true(g.fd == -1 && sent < 1L << 17);
	assert_int_equal(g.pid, 0);
	assert_true(gone);
	/* killed before its pipe closed: it killed nothing on an end of file */
	assert_true(a_alive);
	snprintf(want, sizeof(want),
		 "dptp-run: warning: the guard (pid %d) read nothing for 2 s; killed it: a SIGKILLed launcher now "
		 "leaves its workers' children\n", (int)guard);
	assert_string_equal(out, want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_watched_group_killed),
		cmocka_unit_test(test_forgotten_group_left),
		cmocka_unit_test(test_normal_end_kills_nothing),
		cmocka_unit_test(test_dirs_removed_when_launcher_dies),
		cmocka_unit_test(test_dirs_kept_on_normal_end),
		cmocka_unit_test(test_stopped_guard_killed_at_stop),
		cmocka_unit_test(test_full_pipe_ends_stopped_guard),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
