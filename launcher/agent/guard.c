/* Worker guard (see guard.h). */
#include "agent/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plane/shm.h"

/* One record per write, smaller than PIPE_BUF, so writes never interleave.
 * 'd' is followed by pgid bytes of a path (in the same write). */
struct rec {
	int32_t op; /* 'w' watch, 'f' forget, 'd' directory to remove, 'q' normal end */
	int32_t pgid;
};

enum { GUARD_MAX = 4096, GUARD_PATH = 1024, GUARD_DIRS = 2 };
/* how long the guard waits for the killed groups to go: 300 x 10 ms */
enum { GUARD_WAIT_STEPS = 300, GUARD_WAIT_STEP_NS = 10000000 };
/* How long the launcher waits on the guard: for room in its pipe, and for
 * its exit after 'q'. The guard reads each record as it comes and, on 'q',
 * exits at once (one read, then _exit: nothing to clean, the launcher ends
 * its job itself); 2 s is a hundred times what a runnable process waits
 * for a CPU on a loaded 2-core machine. Past it the guard is stopped
 * (SIGSTOP) or stuck, and waiting on would hold the launcher with it. */
enum { GUARD_BOUND_MS = 2000, GUARD_POLL_FIRST_NS = 100000, GUARD_POLL_NS = 10000000 };

struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* rm -rf below an open directory with system calls alone (no malloc after
 * fork in a threaded launcher); depth-bounded, never follows a link. */
static void rm_below(int dfd, int depth)
{
	char buf[4096];
	long n;
	if (depth > 16)
		return;
	while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n; ) {
			struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
			const char *nm = d->d_name;
			off += d->d_reclen;
			if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2])))
				continue;
			if (d->d_type == DT_DIR) {
				int sub = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
				if (sub >= 0) {
					rm_below(sub, depth + 1);
					close(sub);
				}
				unlinkat(dfd, nm, AT_REMOVEDIR);
			} else {
				unlinkat(dfd, nm, 0);
			}
		}
	}
}

/* Whether a process of the groups pg[0..n) is still running (a zombie has
 * let go of its files and locks, and the orphans' reaper may take seconds
 * to take it): every /proc/<pid>/stat, system calls only. Without /proc,
 * kill(2) answers, zombies included. */
static bool groups_running(const pid_t *pg, size_t n)
{
	char buf[4096], st[512];
	long got;
	bool running = false;
	if (!n)
		return false;
	int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		for (size_t i = 0; i < n && !running; i++)
			running = kill(-pg[i], 0) == 0;
		return running;
	}
	while (!running && (got = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < got && !running;) {
			struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
			off += d->d_reclen;
			if (d->d_name[0] < '1' || d->d_name[0] > '9')
				continue;
			int pd = openat(dfd, d->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			int fd = pd < 0 ? -1 : openat(pd, "stat", O_RDONLY | O_CLOEXEC);
			ssize_t k = fd < 0 ? -1 : read(fd, st, sizeof(st) - 1);
			if (pd >= 0)
				close(pd);
			if (fd >= 0)
				close(fd);
			if (k <= 0)
				continue;
			st[k] = '\0';
			/* "pid (comm) S ppid pgrp ...": comm may hold ") " */
			const char *p = strrchr(st, ')');
			if (!p || p[1] != ' ' || !p[2] || p[2] == 'Z' || p[2] == 'X')
				continue;
			for (p += 3; *p == ' '; p++)
				;
			while (*p && *p != ' ')
				p++; /* ppid */
			long pgrp = 0;
			for (p++; *p >= '0' && *p <= '9'; p++)
				pgrp = pgrp * 10 + (*p - '0');
			for (size_t i = 0; i < n && !running; i++)
				running = pg[i] == pgrp;
		}
	}
	close(dfd);
	return running;
}

/* Runs in the forked child of a possibly multi-threaded launcher: only
 * async-signal-safe calls (read, kill, close_range, sigaction, nanosleep,
 * the system calls of dptp_shm_sweep, _exit). */
__attribute__((noreturn))
static void guard_main(int rfd)
{
	static pid_t pg[GUARD_MAX];
	static char dirs[GUARD_DIRS][GUARD_PATH];
	size_t n = 0, nd = 0;
	struct sigaction ign = {.sa_handler = SIG_IGN};
	sigset_t none;

	/* a terminal's ^C or the job's closing signal is for the launcher and
	 * its workers, not for the guard */
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD)
			sigaction(s, &ign, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* hold nothing of the launcher's open: no listening socket, no log */
	if (dup2(rfd, 0) < 0)
		_exit(1);
	close_range(1, ~0U, 0);
	prctl(PR_SET_NAME, "dptp-run-guard");
	for (;;) {
		struct rec r;
		ssize_t got = read(0, &r, sizeof(r));
		if (got < 0 && errno == EINTR)
			continue;
		if (got != (ssize_t)sizeof(r))
			break; /* EOF: the launcher is gone without saying so */
		if (r.op == 'q')
			_exit(0);
		if (r.op == 'd') { /* past GUARD_DIRS, the last slot is replaced */
			char *dir = dirs[nd < GUARD_DIRS ? nd++ : GUARD_DIRS - 1];
			if (r.pgid <= 0 || r.pgid >= GUARD_PATH || read(0, dir, (size_t)r.pgid) != r.pgid)
				break;
			dir[r.pgid] = '\0';
			continue;
		}
		if (r.op == 'w' && n < GUARD_MAX && r.pgid > 1) {
			pg[n++] = r.pgid;
		} else if (r.op == 'f') {
			for (size_t i = 0; i < n; i++)
				if (pg[i] == r.pgid) {
					pg[i] = pg[--n];
					break;
				}
		}
	}
	for (size_t i = 0; i < n; i++)
		kill(-pg[i], SIGKILL);
	/* a worker killed in its setup leaves its /dev/shm names, unlocked
	 * once it has exited: removed (with every other dead job's) once the
	 * groups are gone, bounded (a process stuck in the kernel) */
	for (int t = 0; t < GUARD_WAIT_STEPS; t++) {
		bool running = groups_running(pg, n);
		dptp_shm_sweep();
		if (!running)
			break;
		nanosleep(&(struct timespec){.tv_nsec = GUARD_WAIT_STEP_NS}, NULL);
	}
	for (size_t i = 0; i < nd; i++) {
		const char *dir = dirs[i];
		int dfd = dir[0] ? open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
		if (dfd >= 0) {
			rm_below(dfd, 0);
			close(dfd);
			rmdir(dir);
		}
	}
	_exit(0);
}

int guard_start(struct guard *g)
{
	int p[2];
	g->pid = 0;
	g->fd = -1;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	/* the launcher's end only: a write never waits on the guard unbounded */
	if (fcntl(p[1], F_SETFL, O_NONBLOCK) < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return -e;
	}
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return -e;
	}
	if (pid == 0)
		guard_main(p[0]);
	close(p[0]);
	g->pid = pid;
	g->fd = p[1];
	return 0;
}

static long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* One write of at most PIPE_BUF bytes on the non-blocking pipe: all of it
 * or nothing, so records never interleave. A guard that reads nothing
 * (stopped) fills the pipe: room is waited for GUARD_BOUND_MS at most.
 * System calls only (the vfork child writes its watch with it). 0, or
 * -errno: -EAGAIN when the pipe stayed full, -EPIPE when the guard is gone. */
static int put(int fd, const void *buf, size_t len)
{
	long end = -1;
	for (;;) {
		ssize_t w = write(fd, buf, len);
		if (w == (ssize_t)len)
			return 0;
		if (w >= 0)
			return -EIO; /* not for a pipe and len <= PIPE_BUF */
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		long now = now_ms();
		if (end < 0)
			end = now + GUARD_BOUND_MS;
		if (now >= end)
			return -EAGAIN;
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		poll(&p, 1, (int)(end - now));
	}
}

/* Reaps pid within ms: true when it is reaped (or was, by the job's
 * reaper: ECHILD); false while it still runs, unreaped, so that its pid is
 * still the guard's. Looks again after 0.1 ms, doubling up to 10 ms: the
 * guard exits within a fraction of a millisecond of 'q'. */
static bool reap_within(pid_t pid, long ms)
{
	long end = now_ms() + ms, nap = GUARD_POLL_FIRST_NS;
	for (;;) {
		pid_t r = waitpid(pid, NULL, WNOHANG);
		if (r == pid || (r < 0 && errno == ECHILD))
			return true;
		if (r < 0 && errno != EINTR)
			return false;
		if (now_ms() >= end)
			return false;
		nanosleep(&(struct timespec){.tv_nsec = nap}, NULL);
		nap = nap * 2 > GUARD_POLL_NS ? GUARD_POLL_NS : nap * 2;
	}
}

/* The guard is killed (SIGKILL ends a stopped process too) and reaped,
 * bounded: one stuck in the kernel is left to the job's reaper, or to
 * init once the launcher exits. It dies before its pipe closes, so it
 * never acts on an end of file with what it has read so far. Whether it
 * was killed (false: it had exited). */
static bool guard_kill(struct guard *g)
{
	bool killed = false;
	if (g->pid > 0 && !reap_within(g->pid, 0)) {
		killed = kill(g->pid, SIGKILL) == 0;
		reap_within(g->pid, GUARD_BOUND_MS);
	}
	if (g->fd >= 0)
		close(g->fd);
	g->fd = -1;
	g->pid = 0;
	return killed;
}

/* A record the launcher could not hand over in GUARD_BOUND_MS: the guard
 * (stopped) would act on a state it no longer has, so it goes, and the job
 * runs on unguarded. Its absence costs nothing at a normal end: the
 * launcher kills each group, sweeps /dev/shm and removes its folders
 * itself; only a SIGKILLed launcher now leaves its workers' children. */
static void lost(struct guard *g, int rc)
{
	pid_t pid = g->pid;
	if (rc == -EAGAIN && guard_kill(g)) /* -EPIPE: gone, the job's reaper takes it */
		fprintf(stderr, "dptp-run: warning: the guard (pid %d) read nothing for %d s; killed it: "
				"a SIGKILLed launcher now leaves its workers' children\n",
			(int)pid, GUARD_BOUND_MS / 1000);
}

static int send_rec(const struct guard *g, int op, pid_t pgid)
{
	struct rec r = {.op = op, .pgid = (int32_t)pgid};
	return g->fd < 0 ? 0 : put(g->fd, &r, sizeof(r));
}

void guard_remove_dir(struct guard *g, const char *dir)
{
	struct {
		struct rec r;
		char path[GUARD_PATH];
	} m;
	size_t len = strlen(dir);
	if (g->fd < 0 || !len || len >= GUARD_PATH)
		return;
	m.r.op = 'd';
	m.r.pgid = (int32_t)len;
	memcpy(m.path, dir, len);
	/* one write of at most PIPE_BUF bytes: atomic beside the other records */
	lost(g, put(g->fd, &m, sizeof(m.r) + len));
}

void guard_watch(const struct guard *g, pid_t pgid)
{
	/* the vfork child: a watch not written in time is dropped; the
	 * launcher's next record finds the pipe full and ends the guard */
	(void)send_rec(g, 'w', pgid);
}

void guard_forget(struct guard *g, pid_t pgid)
{
	lost(g, send_rec(g, 'f', pgid));
}

void guard_stop(struct guard *g)
{
	if (g->fd < 0)
		return;
	int rc = send_rec(g, 'q', 0);
	if (rc == -EAGAIN) {
		lost(g, rc);
		return;
	}
	close(g->fd);
	g->fd = -1;
	/* the guard exits at once on 'q' (ECHILD when the job's reaper took
	 * it). One that has not exited in GUARD_BOUND_MS is stopped: 'q'
	 * waits in its pipe, so all it would still do is exit, killing and
	 * removing nothing; the launcher's end does that cleanup itself */
	pid_t pid = g->pid;
	if (pid > 0 && !reap_within(pid, GUARD_BOUND_MS) && guard_kill(g))
		fprintf(stderr, "dptp-run: warning: the guard (pid %d) did not exit within %d s of the job's end; killed it\n",
			(int)pid, GUARD_BOUND_MS / 1000);
	g->pid = 0;
}
