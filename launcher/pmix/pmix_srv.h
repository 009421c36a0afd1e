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
#include <stdint.h>
#include <sys/types.h>

#include "rdzv/rendezvous.h"
#include "base/util.h"

/* Where a local client is in the PMIx protocol. */
enum pmix_srv_client { PMIX_SRV_CLIENT_NONE, PMIX_SRV_CLIENT_INIT, PMIX_SRV_CLIENT_FINALIZED };

struct srv_event; /* one upcall, private to pmix_srv.c */

struct pmix_srv {
	bool up;
	int evpipe[2];
	char tmpdir[PATH_MAX];
	char nspace[256];
	bool nspace_registered;
	unsigned nlocal;
	unsigned base_rank;
	unsigned world;
	struct pmix_srv_proc *procs; /* per local rank of the current job */
	char exe[256];               /* the workers' executable, for queries */
	char hostname[256];          /* this node's name in the job (dptp_hostname) */
	unsigned slots;              /* this node's cores (rdzv_common_slots), set by the caller */
	unsigned univ;               /* universe size: the job's nodes' slots */
	/* Open MPI's shared-memory backing files (btl_vader_backing_directory):
	 * a 0700 folder in /dev/shm per launcher, removed with the tmpdir, so
	 * that nodes laid over one machine never share a segment name and no
	 * segment outlives the job; "" when /dev/shm is not there */
	char shmdir[PATH_MAX];
	struct rdzv_node *nodes;     /* the job's nodes (copy), NULL: one node */
	unsigned nnodes;
	pid_t *rpids;                /* per global rank: the other nodes' pids (xnode) */
	/* upcalls read while waiting for deregistrations during a job, kept
	 * in order for the next pmix_srv_dispatch */
	struct srv_event *stash, **stash_end;
	unsigned releasing;  /* deregistrations posted, not yet waited for */
	uintptr_t release_gen; /* tags their callbacks: late ones are told apart */
	int fd_hwm;          /* highest descriptor open when clients were released */
	int *fd_holds;       /* placeholders on the free numbers up to fd_hwm */
	size_t nfd_holds;
	/* counters for tests and --verbose style diagnostics */
	unsigned long fences, finalized;
};

/* A fence whose local participants all arrived (one fence_nb upcall). */
struct pmix_srv_fence;
/* Its participants: wildcard (the whole job) or the listed ranks. */
bool pmix_srv_fence_wildcard(const struct pmix_srv_fence *f);
size_t pmix_srv_fence_nranks(const struct pmix_srv_fence *f);
unsigned pmix_srv_fence_rank(const struct pmix_srv_fence *f, size_t i);
/* 0 when every participant is in this server's namespace. */
int pmix_srv_fence_foreign(const struct pmix_srv_fence *f);
/* The blob the local participants contributed. */
const void *pmix_srv_fence_data(const struct pmix_srv_fence *f, size_t *len);
/* Completes the fence with data (every node's blob, concatenated; copied)
 * or an error (ok false), and frees f. */
void pmix_srv_fence_complete(struct pmix_srv_fence *f, bool ok, const void *data, size_t len);

/* A direct-modex request: a local client wants a remote rank's data. */
struct pmix_srv_dmodex;
unsigned pmix_srv_dmodex_rank(const struct pmix_srv_dmodex *d);
/* Answers it (data: that rank's blob as its server gave it; copied) or
 * fails it (found false), and frees d. */
void pmix_srv_dmodex_complete(struct pmix_srv_dmodex *d, bool found, const void *data, size_t len);
/* Asks this server for a local rank's data (for another node); the answer
 * comes through the sink's dmodex_local(token, ...) on the main thread. */
int pmix_srv_dmodex_local(struct pmix_srv *s, unsigned rank, void *token);

/* Called from dispatch on the main thread. */
struct pmix_srv_sink {
	void (*abort)(void *ctx, unsigned rank, int status, const char *msg);
	/* Takes f (returns true) to complete it later, e.g. across nodes;
	 * NULL or false: completed at once with the local data. */
	bool (*fence)(void *ctx, struct pmix_srv_fence *f);
	/* Takes d (returns true); NULL or false: not found. */
	bool (*dmodex)(void *ctx, struct pmix_srv_dmodex *d);
	void (*dmodex_local)(void *ctx, void *token, bool found, const void *data, size_t len);
	/* A job-wide event a local client notified: blob (borrowed) goes to
	 * every other node's pmix_srv_notify_local. NULL: one node. */
	void (*notify)(void *ctx, const void *blob, size_t len);
	/* A local rank asked for what dptp-run refuses and its job cannot
	 * survive (PMIx_Spawn): msg says what (logged already). */
	void (*refuse)(void *ctx, unsigned rank, const char *msg);
	/* The library crashed in its own thread and was contained
	 * (crash_guard.h): nothing of it may be called any more. */
	void (*crashed)(void *ctx);
	void *ctx;
};

/* Creates the private tmpdir and /dev/shm folder (0700) and starts the
 * server (it picks the datastore). made_dir (may be NULL) is called with
 * each folder as soon as it exists, before the server starts: a launcher
 * killed meanwhile has its guard remove them. Returns 0 or a negative
 * errno with err set; -EINVAL: the user's PMIx settings cannot work (a
 * usage error, not a missing server). */
int pmix_srv_init(struct pmix_srv *s, void (*made_dir)(void *ctx, const char *dir), void *ctx,
	struct dptp_err *err);
/* Registers nspace with the job and every local client (ranks base..base+n-1
 * of world), waiting (bounded) until all registrations completed. nodes
 * (nnodes of them, this one is my_node) describes a job over several nodes;
 * NULL: one node. */
int pmix_srv_register_job(struct pmix_srv *s, const char *nspace, unsigned nlocal,
	unsigned base_rank, unsigned world, const char *hostname, uid_t uid, gid_t gid,
	const struct rdzv_node *nodes, unsigned nnodes, unsigned my_node,
	struct dptp_err *err);
/* Adds the PMIx client variables for rank to *env (argv-style, malloc'd). */
int pmix_srv_setup_fork(struct pmix_srv *s, unsigned rank, char ***env, struct dptp_err *err);
/* Before the launcher signals a live worker of the current job: deregisters
 * its client, which closes the server's end of its connection, so that its
 * death is no lost connection to the library (see pmix_srv.c). Posts only;
 * pmix_srv_wait_released waits for every posted one. */
void pmix_srv_release_client(struct pmix_srv *s, unsigned rank);
/* Waits (bounded) until the library has deregistered every client posted
 * since the last wait; upcalls that arrive meanwhile wait, in order, for
 * the next pmix_srv_dispatch. 0, or -ETIMEDOUT/-EIO with err set. */
int pmix_srv_wait_released(struct pmix_srv *s, double timeout, struct dptp_err *err);
/* Deregisters the current nspace (and its clients). */
void pmix_srv_deregister_job(struct pmix_srv *s);
/* Whether rank (of the current job, on this node) called PMIx_Init and
 * PMIx_Finalize, as far as the upcalls dispatched so far tell. */
enum pmix_srv_client pmix_srv_client_state(const struct pmix_srv *s, unsigned rank);
/* The launcher tells the server what became of its workers (answers to
 * PMIX_QUERY_PROC_TABLE and PMIX_QUERY_JOB_STATUS). */
void pmix_srv_worker_started(struct pmix_srv *s, unsigned rank, pid_t pid, const char *exe);
void pmix_srv_worker_exited(struct pmix_srv *s, unsigned rank, int exitcode);
/* Another node's worker (global rank) has this pid (its proc table entry). */
void pmix_srv_remote_pid(struct pmix_srv *s, unsigned rank, pid_t pid);
/* Delivers another node's event (a sink notify blob) to this node's
 * clients, marked so that it is not forwarded again. */
int pmix_srv_notify_local(struct pmix_srv *s, const void *blob, size_t len);
/* Read end of the event pipe, for poll(); -1 when the server is down. */
int pmix_srv_fd(const struct pmix_srv *s);
/* Whether upcalls wait in the stash (poll would not show them). */
bool pmix_srv_pending(const struct pmix_srv *s);
/* Completes every posted upcall. */
void pmix_srv_dispatch(struct pmix_srv *s, const struct pmix_srv_sink *sink);
/* Stops the server and removes its tmpdir. Accepts a zeroed struct. */
void pmix_srv_finalize(struct pmix_srv *s);
/* For a launcher about to exit after a failed job: deregisters the clients
 * (which runs the cleanup they registered with PMIx_Job_control: files,
 * directories), removes the private tmpdir, but does not call PMIx_server_finalize, which can hang or crash
 * when clients died in the middle of an operation. */
void pmix_srv_abandon(struct pmix_srv *s);

#endif
