/* LD_PRELOAD helper for leftovers.py: the rank named by
 * DPTP_TEST_SETUP_STALL_RANK stops itself (SIGSTOP) when it first opens a
 * peer's host-plane slot, that is once every rank of the host has made its
 * own: the others wait in the setup's next round with their slots named in
 * /dev/shm, which is where a killed job leaves them. Nothing else changes. */
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int shm_open(const char *name, int oflag, mode_t mode)
{
	static int (*real)(const char *, int, mode_t);
	static int done;
	const char *want = getenv("DPTP_TEST_SETUP_STALL_RANK"), *rank = getenv("RANK");
	if (!real)
		real = (int (*)(const char *, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
	if (!done && want && rank && !strcmp(want, rank) && !(oflag & O_CREAT) && !strncmp(name, "/dptp-lk-", 9) &&
	    strncmp(name, "/dptp-lk-res-", 13)) {
		done = 1;
		raise(SIGSTOP);
	}
	return real(name, oflag, mode);
}
