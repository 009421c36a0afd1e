/* Everything a check needs, built once per run by dptp_ctx_init. */
#ifndef DPTP_LIB_CTX_H
#define DPTP_LIB_CTX_H

#include <stdbool.h>
#include <sys/types.h>

#include "bootstrap/bootstrap.h"
#include "plane/comm.h"
#include "base/dtype.h"
#include "base/fault.h"
#include "base/layout.h"
#include "ipc/workspace.h"
#include "plane/group.h"

struct dptp_params {
	int dp, pp, tp;          /* 0 = derive */
	int tokens, hidden;
	enum dptp_dtype dtype;
	uint64_t seed;
	double eps;
	double timeout;          /* per check, seconds */
	dptp_fault_set faults;
	bool cuda;               /* data plane and workspace on GPUs */
	uint64_t xseq;           /* exchange sequence to continue from: a later
				  * context of the same job (--layouts) uses fresh keys */
};

struct dptp_ctx {
	struct dptp_bootstrap *b;
	struct dptp_layout layout;
	struct dptp_params p;
	struct dptp_coord me;
	int rank;
	struct dptp_exchange x;
	struct dptp_comm *comm;
	struct dptp_peer *peers;  /* [world] */
	int *host_of;             /* [world] */
	int nhosts;
	uint64_t attempt;         /* this attempt's nonce: rank 0's peers[].nonce */
	struct dptp_group tp, pp, dp, ep, world;
	struct dptp_ipc_job ipc;  /* what the IPC workspaces borrow of this */
	struct dptp_ipc_foreign foreign;  /* datagrams from outside the job, dropped */
	const struct dptp_ws_ops *ws;  /* the fused-allreduce workspace, host or GPU */
};

/* Collective. Validates the layout against the world (-EINVAL naming the
 * numbers), learns the peers, and creates the data plane, chosen here once:
 * the host data plane; with p->cuda, each rank's device from LOCAL_RANK
 * (plane/device.h) and NCCL (one GPU per rank) or the host data plane
 * staged through device memory (ranks sharing a GPU, or no NCCL), with the
 * GPU workspace. */
int dptp_ctx_init(struct dptp_ctx *c, struct dptp_bootstrap *b, const struct dptp_params *p,
		  struct dptp_err *err);
void dptp_ctx_release(struct dptp_ctx *c);

/* Deterministic input of (seed, global rank or replica, index): small
 * integers and halves that every dtype holds exactly. */
float dptp_input_value(uint64_t seed, uint64_t stream, uint64_t index);
/* n values of one stream, indices 0..n-1, stored as dt. */
void dptp_input_fill(void *p, size_t n, uint64_t seed, uint64_t stream, enum dptp_dtype dt);
/* Elements first .. first+n-1 of the same stream, into p[0 .. n). */
void dptp_input_fill_at(void *p, size_t first, size_t n, uint64_t seed, uint64_t stream,
			enum dptp_dtype dt);

#endif
