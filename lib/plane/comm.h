/* The data plane: collectives on buffers among the members of a group,
 * behind a small vtable. `host` (POSIX shared memory within a host, the
 * bootstrap across hosts) and `nccl` (communicators from ncclCommSplit).
 *
 * Buffers are backend memory: host memory for `host`, device memory for
 * `nccl`; use alloc/upload/download to move data between them. Like the
 * exchange backend, every op is collective over the world (lockstep). */
#ifndef DPTP_LIB_COMM_H
#define DPTP_LIB_COMM_H

#include <stddef.h>

#include "base/dtype.h"
#include "plane/group.h"

struct dptp_comm;

struct dptp_comm_ops {
	const char *name;
	/* root is a group-local index (NCCL style). */
	int (*bcast)(struct dptp_comm *c, const struct dptp_group *g, void *buf, size_t bytes,
		     int root, struct dptp_err *err);
	int (*allgather)(struct dptp_comm *c, const struct dptp_group *g, const void *send,
			 void *recv, size_t bytes, struct dptp_err *err);
	/* Sum in place; fp32 accumulation in group-rank order 0..n-1. */
	int (*allreduce)(struct dptp_comm *c, const struct dptp_group *g, void *buf, size_t count,
			 enum dptp_dtype dt, struct dptp_err *err);
	void *(*alloc)(struct dptp_comm *c, size_t bytes);
	void (*free)(struct dptp_comm *c, void *p);
	int (*upload)(struct dptp_comm *c, void *dst, const void *host, size_t bytes);
	int (*download)(struct dptp_comm *c, void *host, const void *src, size_t bytes);
	void (*destroy)(struct dptp_comm *c);
};

struct dptp_comm {
	const struct dptp_comm_ops *ops;
	struct dptp_exchange *x;
	void *impl;
};

/* host_of[r]: a host index per global rank (ranks with equal values share
 * memory). capacity: the largest buffer any op will move. attempt: a nonce
 * every rank passes the same value of, new for each attempt of the job (it
 * names the /dev/shm slots; the slots of any job whose owner is gone are
 * removed, see plane/shm.h). Collective. */
int dptp_comm_host_create(struct dptp_comm **out, struct dptp_exchange *x, const int *host_of,
			  size_t capacity, uint64_t attempt, struct dptp_err *err);
/* A rank's slot name, "/dptp-<hash of job>-<attempt, 16 hex>-<rank>". */
void dptp_comm_host_slot_name(char *buf, size_t n, const char *job, uint64_t attempt, int rank);
void dptp_comm_destroy(struct dptp_comm *c);

/* The host data plane staged through device memory (cuda feature; -ENOTSUP
 * without): buffers on the current device, collectives through `host`,
 * which it takes over (destroyed with it). */
int dptp_comm_staged_create(struct dptp_comm **out, struct dptp_comm *host, struct dptp_exchange *x,
			    struct dptp_err *err);

/* The exchange backend's buffer broadcast from a group-local root, on the
 * data plane c, with the source from dptp_xchg_root_src() (as
 * dptp_xchg_bcast_root). */
int dptp_xchg_bcast_buf(struct dptp_exchange *x, struct dptp_comm *c, const struct dptp_group *g,
			int root, void *buf, size_t bytes, struct dptp_err *err);

/* Sum of n buffers of count elements in rank order, fp32 accumulation,
 * rounded once to dt. Shared by every backend's reference path. */
void dptp_reduce_sum(void *out, const void *const *in, int n, size_t count, enum dptp_dtype dt);

#endif
