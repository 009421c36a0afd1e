/* The launcher's PMIx server (OpenPMIx server API only).
 *
 * Upcalls run on PMIx's progress thread: they only copy their arguments into
 * a struct pmix_srv_event and write its pointer to a pipe that the launcher's
 * poll loop reads (pmix_srv_fd). pmix_srv_dispatch() then completes them on
 * the main thread. */
#ifndef DPTP_LAUNCHER_PMIX_SRV_H
#define DPTP_LAUNCHER_PMIX_SRV_H

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#include "util.h"

struct pmix_srv {
	bool up;
	int evpipe[2];
	char tmpdir[PATH_MAX];
	char nspace[256];
	bool nspace_registered;
	unsigned nlocal;
	unsigned base_rank;
	/* counters for tests and --verbose style diagnostics */
	unsigned long fences, finalized;
};

/* Called from dispatch on the main thread for an abort upcall. */
struct pmix_srv_sink {
	void (*abort)(void *ctx, unsigned rank, int status, const char *msg);
	void *ctx;
};

/* Creates the private tmpdir (0700) and starts the server. Returns 0 or a
 * negative errno with err set. */
int pmix_srv_init(struct pmix_srv *s, struct dptp_err *err);
/* Registers nspace with the job and every local client (ranks base..base+n-1
 * of world), waiting (bounded) until all registrations completed. */
int pmix_srv_register_job(struct pmix_srv *s, const char *nspace, unsigned nlocal,
	unsigned base_rank, unsigned world, const char *hostname, uid_t uid, gid_t gid,
	struct dptp_err *err);
/* Adds the PMIx client variables for rank to *env (argv-style, malloc'd). */
int pmix_srv_setup_fork(struct pmix_srv *s, unsigned rank, char ***env, struct dptp_err *err);
/* Deregisters the current nspace (and its clients). */
void pmix_srv_deregister_job(struct pmix_srv *s);
/* Read end of the event pipe, for poll(); -1 when the server is down. */
int pmix_srv_fd(const struct pmix_srv *s);
/* Completes every posted upcall. */
void pmix_srv_dispatch(struct pmix_srv *s, const struct pmix_srv_sink *sink);
/* Stops the server and removes its tmpdir. Accepts a zeroed struct. */
void pmix_srv_finalize(struct pmix_srv *s);

#endif
