/* LD_PRELOAD helper for faults.py: SIGUSR1 makes the process _exit(3), so a
 * test can make one stopped worker "exit 3" in the middle of a collective
 * (send SIGUSR1, then SIGCONT). Nothing else changes. */
#include <signal.h>
#include <unistd.h>

static void on_usr1(int sig)
{
	(void)sig;
	_exit(3);
}

__attribute__((constructor)) static void install(void)
{
	struct sigaction sa = {.sa_handler = on_usr1};
	sigaction(SIGUSR1, &sa, NULL);
}
