/* The NCCL data plane (built with the nccl feature). */
#ifndef DPTP_LIB_COMM_NCCL_H
#define DPTP_LIB_COMM_NCCL_H

#include "plane/comm.h"

/* Collective over the world: one world communicator on `device`, then one
 * ncclCommSplit per group in groups[] (same order on every rank). */
int dptp_comm_nccl_create(struct dptp_comm **out, struct dptp_exchange *x, int device,
			  const struct dptp_group *const *groups, int ngroups, struct dptp_err *err);

/* Creates and destroys a communicator over g on the current device, the way
 * NCCL users do; returns NCCL's verdict (e.g. "Duplicate GPU detected").
 * Collective over the world (one exchange round). */
int dptp_nccl_probe(int nranks, int rank, struct dptp_exchange *x, const struct dptp_group *g,
		    struct dptp_err *err);

/* Enqueues an allreduce (sum) over g's communicator on `stream` (a CUDA
 * stream as void *) without waiting: for timing with events. */
int dptp_comm_nccl_allreduce_on(struct dptp_comm *c, const struct dptp_group *g, void *buf,
				size_t count, enum dptp_dtype dt, void *stream, struct dptp_err *err);
/* True when c is the NCCL data plane (in every build; 0 without NCCL). */
int dptp_comm_is_nccl(const struct dptp_comm *c);

#endif
