/* Containment of a crash inside the PMIx library's own threads (see
 * crash_guard.h for why). */
#include "pmix/crash_guard.h"

#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* the executable segments of libpmix, its plugins and libevent */
#define MAX_RANGES 64
static struct {
	uintptr_t lo, hi;
} ranges[MAX_RANGES];
static int nranges;
static volatile sig_atomic_t tripped;
static int post_fd = -1;
static void *post_token;
static struct sigaction old_segv, old_bus;
static bool installed;

static bool library_of_interest(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	return !strncmp(b, "libpmix", 7) || !strncmp(b, "pmix_mca_", 9) || !strncmp(b, "libevent", 8);
}

static int add_ranges(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	(void)arg;
	if (!info->dlpi_name || !library_of_interest(info->dlpi_name))
		return 0;
	for (int i = 0; i < info->dlpi_phnum && nranges < MAX_RANGES; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		ranges[nranges].lo = info->dlpi_addr + ph->p_vaddr;
		ranges[nranges].hi = ranges[nranges].lo + ph->p_memsz;
		nranges++;
	}
	return 0;
}

static uintptr_t fault_pc(const void *ucontext)
{
	const ucontext_t *uc = ucontext;
#if defined(__x86_64__)
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
	return (uintptr_t)uc->uc_mcontext.pc;
#else
	(void)uc;
	return 0; /* unknown here: never contained */
#endif
}

static bool in_library(uintptr_t pc)
{
	for (int i = 0; i < nranges; i++)
		if (pc >= ranges[i].lo && pc < ranges[i].hi)
			return true;
	return false;
}

static void on_fault(int sig, siginfo_t *si, void *ucontext)
{
	static const char msg[] = "dptp-run: error: the PMIx library crashed in its progress thread "
				  "(a fault inside libpmix/libevent); the job is stopped\n";
	uintptr_t pc = fault_pc(ucontext);
	(void)si;
	if (pc && in_library(pc) && syscall(SYS_gettid) != getpid() && post_fd >= 0) {
		ssize_t n;
		tripped = 1;
		n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
		n = write(post_fd, &post_token, sizeof(post_token));
		(void)n;
		/* this thread never runs library code again; the launcher's
		 * own threads stop the job, with every wait bounded */
		for (;;)
			pause();
	}
	/* anything else is a crash as before: the previous action (the
	 * default's core dump, or a sanitizer's report) on the re-executed
	 * faulting instruction */
	sigaction(sig, sig == SIGBUS ? &old_bus : &old_segv, NULL);
}

int crash_guard_install(int fd, void *token)
{
	struct sigaction sa;
	if (installed)
		return 0;
	nranges = 0;
	dl_iterate_phdr(add_ranges, NULL);
	if (!nranges)
		return -1;
	post_fd = fd;
	post_token = token;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &old_segv) < 0)
		return -1;
	if (sigaction(SIGBUS, &sa, &old_bus) < 0) {
		sigaction(SIGSEGV, &old_segv, NULL);
		return -1;
	}
	installed = true;
	return 0;
}

void crash_guard_remove(void)
{
	if (!installed)
		return;
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	installed = false;
	post_fd = -1;
}

bool crash_guard_tripped(void)
{
	return tripped;
}
