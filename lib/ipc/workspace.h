/* The fused-allreduce workspace (flashinfer/TRT-LLM style): three Lamport
 * buffers per rank, each with its own IPC socket, exchanged by passing file
 * descriptors around the *exchange group* (the TP group when correct) and
 * mapped by every peer. On the host backend the buffers are memfds. */
#ifndef DPTP_LIB_WORKSPACE_H
#define DPTP_LIB_WORKSPACE_H

#include "ipc/ipcsock.h"
#include "plane/group.h"

#define DPTP_WS_NBUF 3

struct dptp_workspace {
	int rank, size;          /* in the exchange group, as the creator was told */
	const struct dptp_group *xg;
	enum dptp_dtype dt;
	size_t slot_bytes;       /* one peer's contribution */
	size_t buf_bytes;        /* size * slot_bytes */
	uint64_t opid;
	int fds[DPTP_WS_NBUF];
	void *local[DPTP_WS_NBUF];
	void **peer[DPTP_WS_NBUF];   /* [size], peer[b][rank] == local[b] */
	int *peer_fd[DPTP_WS_NBUF];  /* [size], their memfds, open; peer_fd[b][rank] == fds[b] */
	struct dptp_ipcsock socks[DPTP_WS_NBUF];
	size_t used[DPTP_WS_NBUF];   /* bytes per slot the last call through each buffer wrote */
	float *sum;                  /* scratch: the allreduced x of a block of rows */
	size_t sum_cap;              /* its elements */
	void *pulled;                /* scratch: a block of rows of every slot, or of x encoded */
	size_t pulled_cap;           /* its bytes */
	bool *after;                 /* [size]: this call's push of group rank j is complete */
	unsigned calls;
};

/* What the IPC code borrows of the job (filled by the context). */
struct dptp_ipc_job {
	struct dptp_exchange *x;        /* the exchange backend workspaces are built with */
	int rank, world;                /* global */
	const struct dptp_peer *peers;  /* [world]: host, pid, device */
	int tp_rank;
	bool opid_seeded;               /* bug 4: see dptp_opid_agree() */
	uint64_t seed;                  /* ... and its RNG seed */
	bool device_from_tp_rank;       /* bug 3: see dptp_workspace_device() */
	struct dptp_ipc_foreign *foreign; /* datagrams from outside the job, dropped (may be NULL) */
};

/* Binds s under name(group_rank, opid). A name held by a process outside
 * the job (squatted) is -ENOTUNIQ naming that process (pid, uid); one held
 * by a process of the job is -EADDRINUSE naming its global rank. */
int dptp_ipc_bind(const struct dptp_ipc_job *job, struct dptp_ipcsock *s, int group_rank, uint64_t opid,
		  struct dptp_err *err);

/* Collective over g (lockstep): the group's opId. The member at index 0
 * draws it -- the fixed way from OS entropy, low 16 bits = global rank, so no
 * two TP roots of a job and no two jobs collide; or, with opid_seeded (bug 4,
 * the one place it acts), from an RNG seeded with `seed` as vLLM seeds every
 * worker -- and broadcasts it in g with dptp_xchg_bcast_root(). */
int dptp_opid_agree(const struct dptp_ipc_job *job, const struct dptp_group *g, int index,
		    uint64_t *opid, struct dptp_err *err);

/* Which device the workspace allocates on and makes current: this rank's
 * device (from LOCAL_RANK), or with device_from_tp_rank (bug 3, the one place
 * it acts) its tp_rank. */
int dptp_workspace_device(const struct dptp_ipc_job *job);

/* Passes one descriptor per socket around xg: for i in 0..size-1: send own
 * fds to (rank+i)%size, learn who sent, receive from (rank-i)%size. Checks
 * the sender's payload and kernel credentials against the expected member,
 * and reports extra or missing descriptors. Only processes of the job (pid
 * table, our uid) are heard: others' datagrams are dropped and counted in
 * job->foreign; a thread drains the sockets meanwhile, so no neighbour can
 * fill a queue and stall a sender; every send ends by the exchange
 * deadline. in_fds[s][j] receive peer j's
 * descriptor for socket s (-1 when none). Collective (lockstep). Returns 0,
 * or the first problem (the ring always runs to the end). */
int dptp_fd_ring(const struct dptp_ipc_job *job, const struct dptp_group *xg, int rank, int size,
		 struct dptp_ipcsock *socks, int nsocks, const int *my_fds, int **in_fds,
		 struct dptp_err *err);

/* The host and GPU workspaces behind one table, chosen once with the data
 * plane (dptp_ws_host_ops, or dptp_ws_gpu_ops of ipc/workspace_gpu.h). */
struct dptp_ws_ops {
	const char *name;
	bool alone;         /* a group of one still goes through the workspace */
	const char *place;  /* "" or " on the GPU", for details */
	/* dptp_workspace_create(), into a new *ws */
	int (*create)(void **ws, const struct dptp_ipc_job *job, const struct dptp_group *xg, int rank,
		      int size, size_t max_bytes, enum dptp_dtype dt, struct dptp_err *err);
	/* dptp_workspace_fused_allreduce() on host buffers; *algo names what ran */
	int (*fused)(void *ws, const void *x, const void *residual_in, const void *gamma,
		     void *residual_out, void *norm_out, int tokens, int hidden, float eps,
		     double deadline, const char **algo, struct dptp_err *err);
	void (*destroy)(void *ws);  /* NULL-safe */
};

extern const struct dptp_ws_ops dptp_ws_host_ops;
extern const struct dptp_ws_ops dptp_ws_gpu_ops;

/* Collective over xg. rank/size are what the caller believes (correct:
 * xg->index, xg->size). */
int dptp_workspace_create(struct dptp_workspace *ws, const struct dptp_ipc_job *job,
			  const struct dptp_group *xg, int rank, int size, size_t slot_bytes,
			  enum dptp_dtype dt, struct dptp_err *err);
void dptp_workspace_release(struct dptp_workspace *ws);

/* One-shot Lamport allreduce of x (tokens*hidden) + residual add + RMSNorm *
 * gamma: residual_out = sum_r x_r + residual_in, norm_out = rmsnorm(
 * residual_out) * gamma. Sum in fp32 in group-rank order. Spins are bounded
 * by `deadline` (dptp_now() time): -ETIMEDOUT naming the missing peer. */
int dptp_workspace_fused_allreduce(struct dptp_workspace *ws, const void *x,
				   const void *residual_in, const void *gamma,
				   void *residual_out, void *norm_out, int tokens, int hidden,
				   float eps, double deadline, struct dptp_err *err);

/* The plain reference: residual_out/norm_out from the already-summed input. */
void dptp_residual_rmsnorm_ref(const float *sum, const void *residual_in, const void *gamma,
			       void *residual_out, void *norm_out, int tokens, int hidden,
			       float eps, enum dptp_dtype dt);

#endif
