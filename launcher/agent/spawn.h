/* Starting one worker: own session and process group, default signal dispositions and
 * mask, PR_SET_PDEATHSIG, an optional CPU affinity (--numa-binding), and a
 * close-on-exec exec-status pipe so that an exec failure comes back as an
 * errno instead of a silent exit 127. */
#ifndef DPTP_LAUNCHER_SPAWN_H
#define DPTP_LAUNCHER_SPAWN_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

struct guard;

struct spawn_req {
	const char *path;
	char *const *argv;
	char *const *envp;
	int stdout_fd; /* -1: inherit */
	int stderr_fd; /* -1: inherit */
	const void *cpus;  /* CPU affinity mask (sched_setaffinity's form), or NULL */
	size_t cpus_len;
	const struct guard *guard; /* the child registers its process group before exec (or NULL) */
};

/* Signals whose disposition is not SIG_DFL in the launcher; the child resets
 * only those. Call once before spawning. */
void spawn_prepare(void);

/* Marks the errno of a failed sched_setaffinity (the CPU set no longer fits
 * the launcher's cpuset) in spawn_worker's result. */
#define SPAWN_ERR_AFFINITY (1 << 20)

/* Returns 0 with the worker's pid in *pid_out, or -errno when it could not
 * be executed (-(errno | SPAWN_ERR_AFFINITY) when it could not be bound) (*pid_out then holds the exited child's pid for the caller to
 * reap, or 0 when no child was made). */
int spawn_worker(const struct spawn_req *r, pid_t *pid_out);

#endif
