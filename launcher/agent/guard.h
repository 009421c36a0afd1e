/* The worker guard: a tiny process forked before the first worker that
 * outlives a launcher killed with SIGKILL just long enough to take every
 * worker's whole process group with it. Workers run in sessions of their
 * own (as torchrun starts them), so PR_SET_PDEATHSIG reaches the worker
 * itself but not what the worker started; the guard holds the read end of a
 * pipe whose only writer is the launcher, and the kernel closes that end
 * when the launcher dies, however it dies. The guard then also removes the
 * launcher's private PMIx tmpdir and /dev/shm folder, and, once the killed
 * groups are gone (3 s at most), every /dev/shm name of a dead job
 * (plane/shm.h: the slots its workers held), so that nothing is left
 * behind. The launcher never waits on the guard unbounded: a record that
 * finds the pipe full for 2 s (a stopped guard reads nothing), or a guard
 * that has not exited 2 s after guard_stop, is SIGKILLed and reaped, with
 * one line on stderr (the job goes on unguarded; at its end the launcher
 * cleans up itself, as it always does). */
#ifndef DPTP_LAUNCHER_GUARD_H
#define DPTP_LAUNCHER_GUARD_H

#include <sys/types.h>

struct guard {
	pid_t pid; /* 0: no guard (it could not be started) */
	int fd;    /* write end, close-on-exec; -1 without a guard */
};

/* Forks the guard; -errno when it cannot (the job then runs unguarded).
 * The launcher's end of the pipe is non-blocking. */
int guard_start(struct guard *g);
/* The guard kills process group pgid if the launcher dies before
 * guard_forget(pgid) or guard_stop. One write(2) (and poll(2), 2 s at
 * most, while the pipe is full) and nothing else:
 * the worker's own vfork child calls it on itself before it executes the
 * worker, so that no worker can start a process the guard does not know of
 * (a launcher killed between vfork's return and a watch made there left the
 * newest worker's group alive). */
void guard_watch(const struct guard *g, pid_t pgid);
void guard_forget(struct guard *g, pid_t pgid);
/* ... and removes dir with everything in it (the PMIx server's private
 * tmpdir, its /dev/shm folder); two directories, a third replaces the
 * second. */
void guard_remove_dir(struct guard *g, const char *dir);
/* A normal end: the guard exits without killing anything; reaped here,
 * killed first when it has not exited within 2 s (stopped): with 'q' in its
 * pipe, all it had left to do was exit. */
void guard_stop(struct guard *g);

#endif
