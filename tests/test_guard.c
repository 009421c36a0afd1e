/* The worker guard (launcher/agent/guard.c), with real processes: a group
 * it was told of is killed when the launcher dies (the write end of its
 * pipe closes without a word: here the test closes it), a forgotten one is
 * not, a normal end (guard_stop) kills nothing; the directories it was
 * given go with a dead launcher only. Each wait is bounded: a guard that
 * does not act fails the test instead of hanging it. */
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_watched_group_killed),
		cmocka_unit_test(test_forgotten_group_left),
		cmocka_unit_test(test_normal_end_kills_nothing),
		cmocka_unit_test(test_dirs_removed_when_launcher_dies),
		cmocka_unit_test(test_dirs_kept_on_normal_end),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
