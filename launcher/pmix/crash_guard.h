/* A crash inside the PMIx library's own threads, contained.
 *
 * OpenPMIx (4.2.2 here, 5.0.1 on the GPU machine) completes a node-local
 * fence a second time when several of its participants' connections drop
 * in one pass of its progress thread (lost_connection in
 * ptl_base_sendrecv.c calls the tracker's modex callback each time the
 * count of those left matches, before the first completion took the
 * tracker off its list); the second completion runs event_del on the
 * freed tracker. Workers that time out together in a fence (dptp-check's
 * --timeout on a loaded machine, a stopped rank) end dptp-run by SIGSEGV
 * in libevent: no failure report, no cleanup of the PMIx server's files,
 * exit 139 instead of 1.
 *
 * While the server is up, a SIGSEGV or SIGBUS whose faulting instruction
 * lies in libpmix, its plugins or libevent, on a thread other than the
 * launcher's main thread, is contained: the faulting thread writes `token`
 * (a pointer) to `fd` (the server's event pipe), says so on stderr and
 * stops there for good. The launcher then treats the library as gone
 * (crash_guard_tripped), calls nothing of it any more and stops the job
 * as failed. Any other fault keeps its previous action. x86-64 and
 * aarch64 (elsewhere nothing is contained). */
#pragma once

#include <stdbool.h>

int crash_guard_install(int fd, void *token);
void crash_guard_remove(void);
bool crash_guard_tripped(void);
