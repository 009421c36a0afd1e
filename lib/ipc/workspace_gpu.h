/* The fused-allreduce workspace on GPUs (built with the cuda feature; the
 * functions exist in every build and return -ENOTSUP without CUDA). */
#ifndef DPTP_LIB_IPC_WORKSPACE_GPU_H
#define DPTP_LIB_IPC_WORKSPACE_GPU_H

#include "ipc/workspace.h"

#define DPTP_GPU_WS_MAX_RANKS 8 /* DPTP_AR_MAX_RANKS of kernels/kernels.h */

/* Its parts are open to --bench (cli/bench.c), which times the kernel on it. */
struct dptp_gpu_workspace {
	int rank, size, ordinal;
	enum dptp_dtype dt;
	size_t max_bytes, buf_bytes;
	struct dptp_cuda_mem *mine;
	struct dptp_cuda_mem *peer[DPTP_GPU_WS_MAX_RANKS];
	struct dptp_cuda_ar *ar;
	struct dptp_ipcsock sock;
	void *stream;
	void *d_x, *d_res_in, *d_gamma, *d_res_out, *d_norm;
	int sharing;  /* ranks on this GPU */
};

/* Collective over xg (lockstep): a cuMem buffer on the workspace's device
 * (dptp_workspace_device), exported as a POSIX fd and passed around xg
 * through the opId's socket, imported and mapped by the peers, then the
 * fused-allreduce state. */
int dptp_gpu_workspace_create(struct dptp_gpu_workspace **out, const struct dptp_ipc_job *job,
			      const struct dptp_group *xg, int rank, int size, size_t max_bytes,
			      enum dptp_dtype dt, struct dptp_err *err);
void dptp_gpu_workspace_destroy(struct dptp_gpu_workspace *ws);
/* Host buffers in and out; the kernel runs on the GPU. *algo names what ran. */
int dptp_gpu_workspace_fused(struct dptp_gpu_workspace *ws, const void *x, const void *residual_in,
			     const void *gamma, void *residual_out, void *norm_out, int tokens,
			     int hidden, float eps, double deadline, const char **algo,
			     struct dptp_err *err);
/* Thread blocks the kernel may use for `hidden`: all resident at once, also
 * when ranks share the GPU. */
int dptp_gpu_workspace_blocks(struct dptp_gpu_workspace *ws, size_t hidden, struct dptp_err *err);

#endif
