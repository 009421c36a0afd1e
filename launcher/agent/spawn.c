/* Worker start (see spawn.h). */
#include "agent/spawn.h"

#include "agent/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static bool reset_sig[NSIG];

void spawn_prepare(void)
{
	for (int s = 1; s < NSIG; s++) {
		struct sigaction old;
		reset_sig[s] = false;
		if (s == SIGKILL || s == SIGSTOP)
			continue;
		if (sigaction(s, NULL, &old) == 0 && old.sa_handler != SIG_DFL)
			reset_sig[s] = true;
	}
}

/* Runs in the vfork child: only system calls, no allocation, no stdio. */
__attribute__((noreturn, noinline))
static void child(const struct spawn_req *r, int status_fd, pid_t parent)
{
	struct sigaction dfl;
	sigset_t none;
	int e;

	/* no worker outlives a launcher that dies, even by SIGKILL */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		goto fail;
	/* a session of its own, as torchrun's start_new_session=True: a worker
	 * that reads the terminal is not stopped by SIGTTIN, and its process
	 * group (its id is the worker's pid) is what teardown and the guard kill */
	if (setsid() < 0)
		goto fail;
	/* the guard learns the group before anything of the worker runs: once
	 * the parent returns from vfork, the worker may have forked already */
	if (r->guard)
		guard_watch(r->guard, getpid());
	/* --numa-binding: set before exec, so every thread the worker makes
	 * inherits it (torch wraps the command in numactl --physcpubind) */
	if (r->cpus && sched_setaffinity(0, r->cpus_len, (const cpu_set_t *)r->cpus) < 0) {
		e = errno | SPAWN_ERR_AFFINITY;
		goto report;
	}
	if (r->stdout_fd >= 0 && dup2(r->stdout_fd, STDOUT_FILENO) < 0)
		goto fail;
	if (r->stderr_fd >= 0 && dup2(r->stderr_fd, STDERR_FILENO) < 0)
		goto fail;
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int s = 1; s < NSIG; s++)
		if (reset_sig[s])
			sigaction(s, &dfl, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execve(r->path, r->argv, r->envp);
fail:
	e = errno;
report:
	while (write(status_fd, &e, sizeof(e)) < 0 && errno == EINTR)
		;
	_exit(127);
}

int spawn_worker(const struct spawn_req *r, pid_t *pid_out)
{
	int st[2], e = 0;
	pid_t parent = getpid(), pid;
	ssize_t n;

	*pid_out = 0;
	if (pipe2(st, O_CLOEXEC) < 0)
		return -errno;
	/* vfork: the parent sleeps until the child has exec'd or exited, so
	 * the status pipe is settled when it returns; the child shares our
	 * memory and only makes system calls */
	pid = vfork();
	if (pid == 0)
		child(r, st[1], parent);
	e = errno;
	close(st[1]);
	if (pid < 0) {
		close(st[0]);
		return -e;
	}
	*pid_out = pid;
	do
		n = read(st[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(st[0]);
	if (n == (ssize_t)sizeof(e))
		return -(e ? e : EIO); /* the child has _exit(127)ed; the caller reaps it */
	return 0;
}
