/* Who am I, and a key-value exchange with a world-wide fence.
 *
 * Implementations: PMIx client (PMIX_NAMESPACE set: dptp-run, mpirun,
 * srun --mpi=pmix, prterun), torchrun environment (RANK/WORLD_SIZE/
 * MASTER_ADDR/MASTER_PORT, over lib/wire's TCPStore), single process.
 *
 * Semantics: put() stages a blob under a key; after the next fence() every
 * rank can get() any rank's blob. Keys must be unique for the whole job
 * (callers add a sequence number). fence() is collective over the world and
 * bounded by a timeout. */
#ifndef DPTP_LIB_BOOTSTRAP_H
#define DPTP_LIB_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/util.h"

struct dptp_bootstrap;

struct dptp_bootstrap_ops {
	const char *name; /* "pmix", "torchrun", "single" */
	int (*put)(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		   struct dptp_err *err);
	int (*fence)(struct dptp_bootstrap *b, double timeout, struct dptp_err *err);
	/* put() made visible at once, without a fence (PMIx: put + commit;
	 * peers' get() can fetch it directly). */
	int (*publish)(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		       struct dptp_err *err);
	/* Waits up to timeout for the key. *data is malloc'd, caller frees.
	 * -ETIMEDOUT (or -ENOENT) when it never came. */
	int (*get)(struct dptp_bootstrap *b, int rank, const char *key, void **data, size_t *len,
		   double timeout, struct dptp_err *err);
	void (*abort)(struct dptp_bootstrap *b, int status, const char *msg);
	void (*destroy)(struct dptp_bootstrap *b);
};

struct dptp_bootstrap {
	const struct dptp_bootstrap_ops *ops;
	int rank, size;
	int local_rank, local_size;
	int node, nnodes;
	char hostname[256];
	char engine[32];  /* "dptp-run", "mpirun", "srun", "torchrun", "single", "pmix" */
	char job_id[256]; /* unique per job: PMIx namespace, run id, or pid */
	void *impl;
	uint64_t nfences; /* statistics */
	uint64_t put_bytes;
};

/* Picks the implementation from the environment and initialises it;
 * reaching the store (torchrun) takes at most `timeout` seconds.
 * Returns 0, or a negative errno with a message saying what failed and what
 * to check. The caller owns *out (dptp_bootstrap_destroy). */
int dptp_bootstrap_create(struct dptp_bootstrap **out, double timeout, struct dptp_err *err);
void dptp_bootstrap_destroy(struct dptp_bootstrap *b);

int dptp_bootstrap_put(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		       struct dptp_err *err);
int dptp_bootstrap_fence(struct dptp_bootstrap *b, double timeout, struct dptp_err *err);
/* A key that peers can get() without a fence: for the report gathering,
 * which must work when lockstep is lost (a peer stopped mid-collective). */
int dptp_bootstrap_publish(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
			   struct dptp_err *err);
int dptp_bootstrap_get(struct dptp_bootstrap *b, int rank, const char *key, void **data,
		       size_t *len, double timeout, struct dptp_err *err);

/* Implementations (used by create; exposed for tests). */
int dptp_bootstrap_pmix_create(struct dptp_bootstrap **out, struct dptp_err *err);
int dptp_bootstrap_single_create(struct dptp_bootstrap **out, struct dptp_err *err);
/* torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, the
 * TORCHELASTIC_* keys) and a TCPStore: rank 0 hosts it unless the agent does
 * (TORCHELASTIC_USE_AGENT_STORE=True). Strict: a variable set but empty or
 * out of range, or LOCAL_RANK unset with LOCAL_WORLD_SIZE > 1, is -EINVAL
 * naming it; connecting takes at most `timeout` seconds; a RANK claimed by
 * two processes is -EEXIST (at once for the second, and for the others
 * instead of a fence timeout). */
int dptp_bootstrap_torchrun_create(struct dptp_bootstrap **out, double timeout, struct dptp_err *err);

#endif
