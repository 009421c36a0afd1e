/* The cuda backend seen from the checks: device selection, the GPU data
 * plane, the GPU workspace. Every function exists in every build; without
 * CUDA they return -ENOTSUP with a message, so callers need no #if. */
#ifndef DPTP_LIB_CUDA_BACKEND_H
#define DPTP_LIB_CUDA_BACKEND_H

#include "checks/ctx.h"
#include "ipc/ipcsock.h"

/* Number of visible CUDA devices, 0 without CUDA or a driver. */
int dptp_cuda_visible_devices(void);

/* Collective. Picks this rank's device from LOCAL_RANK (an index into the
 * visible devices; DPTP_GPU_SHARING=1 lets several local ranks share one,
 * for single-GPU testing), makes it current, records it in c->peers, and
 * replaces the host data plane with NCCL (one GPU per rank) or with the host
 * data plane staged through device memory (ranks sharing a GPU, or no NCCL). */
int dptp_cuda_ctx_setup(struct dptp_ctx *c, struct dptp_err *err);

/* Makes ordinal current and describes it: "GPU-uuid (pci 0000:19:00.0)". */
int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err);
/* The identity of an ordinal without switching to it. */
int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err);
/* NCCL's own verdict on a communicator over g on the current device. */
int dptp_cuda_nccl_probe(struct dptp_ctx *c, const struct dptp_group *g, struct dptp_err *err);

struct dptp_gpu_workspace;

/* Collective over xg (lockstep): a cuMem buffer on the current device,
 * exported as a POSIX fd and passed around xg through the opId's socket,
 * imported and mapped by the peers, then the fused-allreduce state. */
int dptp_gpu_workspace_create(struct dptp_gpu_workspace **out, const struct dptp_ipc_job *job,
			      const struct dptp_group *xg, int rank, int size, size_t max_bytes,
			      enum dptp_dtype dt, struct dptp_err *err);
void dptp_gpu_workspace_destroy(struct dptp_gpu_workspace *ws);
/* Host buffers in and out; the kernel runs on the GPU. *algo names what ran. */
int dptp_gpu_workspace_fused(struct dptp_gpu_workspace *ws, const void *x, const void *residual_in,
			     const void *gamma, void *residual_out, void *norm_out, int tokens,
			     int hidden, float eps, double deadline, const char **algo,
			     struct dptp_err *err);

/* --bench: fused vs NCCL allreduce + separate residual/RMSNorm over the TP
 * group, for each tokens value; fills rows (caller frees). Collective. */
struct dptp_bench_row;
int dptp_cuda_bench(struct dptp_ctx *c, const int *tokens, int ntokens, const int *hiddens,
		    int nhidden, int iters, struct dptp_bench_row **rows, size_t *nrows,
		    struct dptp_err *err);

#endif
