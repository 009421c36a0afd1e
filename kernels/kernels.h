/* CUDA side of dptp behind a plain C header: devices, GPU IPC memory (cuMem
 * VMM with POSIX file descriptors), the fused allreduce + residual + RMSNorm
 * kernels, the unfused residual + RMSNorm kernel, and timing helpers.
 *
 * No CUDA type crosses this header: device pointers are `void *`, streams and
 * events are `void *` (NULL stream = the legacy default stream). Every
 * function that can fail returns 0 or a negative errno (-EINVAL bad argument,
 * -ENOMEM out of device memory, -ENODEV no device / driver, -ETIMEDOUT a peer
 * never arrived, -EIO any other CUDA error) and, when err is not NULL, puts
 * one message with the CUDA error string in err->msg. Nothing prints.
 *
 * Built only when the cuda feature is on (dptp-config.h: DPTP_HAVE_CUDA). */
#ifndef DPTP_KERNELS_KERNELS_H
#define DPTP_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices (ordinals are after CUDA_VISIBLE_DEVICES, as the runtime sees them) ---- */

int dptp_cuda_device_count(int *count, struct dptp_err *err);
int dptp_cuda_set_device(int ordinal, struct dptp_err *err);
int dptp_cuda_get_device(int *ordinal, struct dptp_err *err);
/* "0000:19:00.0"-style; len >= 32 is enough. */
int dptp_cuda_device_pci_bus_id(int ordinal, char *buf, size_t len, struct dptp_err *err);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it; len >= 41. */
int dptp_cuda_device_uuid(int ordinal, char *buf, size_t len, struct dptp_err *err);
/* Marketing name ("NVIDIA H200"), multiprocessor count, compute capability. */
int dptp_cuda_device_info(int ordinal, char *name, size_t namelen, int *sm_count,
			  int *cc_major, int *cc_minor, struct dptp_err *err);
int dptp_cuda_device_sync(struct dptp_err *err);

/* ---- plain device memory and copies (current device) ---- */

/* Caller frees with dptp_cuda_free() (NULL is fine). */
int dptp_cuda_malloc(void **dptr, size_t bytes, struct dptp_err *err);
void dptp_cuda_free(void *dptr);
/* Any direction (unified addressing). stream NULL: synchronous copy;
 * otherwise asynchronous on that stream. */
int dptp_cuda_memcpy(void *dst, const void *src, size_t bytes, void *stream, struct dptp_err *err);
int dptp_cuda_memset(void *dptr, int byte, size_t bytes, void *stream, struct dptp_err *err);
/* Fills count elements with -0.0 of dt (0x8000 for 16-bit, 0x80000000 for fp32). */
int dptp_cuda_fill_neg_zero(void *dptr, size_t count, enum dptp_dtype dt, void *stream,
			    struct dptp_err *err);

/* ---- GPU IPC memory: cuMem VMM with POSIX file-descriptor handles ---- */

struct dptp_cuda_mem;	/* opaque */

/* Allocation granularity of a device for IPC memory (sizes are rounded up to it). */
int dptp_cuda_mem_granularity(int ordinal, size_t *gran, struct dptp_err *err);
/* Allocates at least bytes (rounded up to the granularity) of memory on
 * device ordinal, exportable as a POSIX fd, and maps it read/write for that
 * device. Contents are undefined. Caller frees with dptp_cuda_mem_destroy(). */
int dptp_cuda_mem_create(int ordinal, size_t bytes, struct dptp_cuda_mem **out, struct dptp_err *err);
/* Exports the physical allocation as a new fd; the caller owns (closes) it.
 * Pass it, with dptp_cuda_mem_size(), to the importing process (SCM_RIGHTS). */
int dptp_cuda_mem_export(const struct dptp_cuda_mem *m, int *fd, struct dptp_err *err);
/* Imports an fd from dptp_cuda_mem_export (any process; borrows the fd, which
 * the caller may close afterwards), maps bytes (the exporter's
 * dptp_cuda_mem_size) and grants read/write to device ordinal (the importer's
 * device; a peer GPU's memory needs peer access, as NVLink gives).
 * Caller frees with dptp_cuda_mem_destroy(). */
int dptp_cuda_mem_import(int ordinal, int fd, size_t bytes, struct dptp_cuda_mem **out,
			 struct dptp_err *err);
void *dptp_cuda_mem_ptr(const struct dptp_cuda_mem *m);
size_t dptp_cuda_mem_size(const struct dptp_cuda_mem *m);
/* Unmaps, releases the VA range and the handle. Accepts NULL. The physical
 * memory lives until every process that mapped it has destroyed its mapping. */
void dptp_cuda_mem_destroy(struct dptp_cuda_mem *m);

/* ---- the fused allreduce + residual add + RMSNorm ----
 *
 *   residual_out = sum over ranks 0..n-1 of x (fp32, that fixed order) + residual_in
 *                  rounded to dtype
 *   norm_out     = residual_out * rsqrt(mean(residual_out^2) + eps) * gamma, rounded
 *
 * residual_in and gamma are the same on every rank (replicated, as in TP).
 * Each rank owns one IPC buffer of dptp_cuda_ar_buffer_bytes() (usually a
 * dptp_cuda_mem exported to the peers) and maps every peer's.
 *
 * one-shot (Lamport): each rank writes its x into every peer's buffer slot,
 *   -0.0 rewritten to +0.0; buffers start at -0.0, readers spin until no -0.0
 *   is left; three buffers rotate, each call clears the one used two calls ago.
 * two-shot: reduce-scatter by token slices, a per-block flag barrier with
 *   system-scope release/acquire, residual + RMSNorm on the slice, all-gather.
 *   Needs tokens >= ranks.
 * Every wait is bounded by the call's timeout; a rank that gives up sets an
 * error in its own device memory, finishes the launch without waiting any
 * more, and dptp_cuda_ar_check() reports -ETIMEDOUT. */

#define DPTP_AR_MAX_RANKS 8
#define DPTP_AR_MAX_BLOCKS 1024
/* Largest hidden per dtype: 32768 (16-bit), 16384 (fp32); a multiple of 8. */
size_t dptp_cuda_ar_max_hidden(enum dptp_dtype dt);

enum dptp_ar_algo {
	DPTP_AR_AUTO = 0,
	DPTP_AR_ONESHOT,
	DPTP_AR_TWOSHOT,
	DPTP_AR_NORM_ONLY,	/* what TP 1 runs: residual + RMSNorm, no communication */
};
const char *dptp_ar_algo_name(enum dptp_ar_algo a);

/* The choice DPTP_AR_AUTO makes, from the bytes of one rank's x
 * (tokens * hidden * element size): one-shot up to 32 MiB at TP 2, 2 MiB at
 * TP 4, 0.5 MiB at TP 8 (vLLM's SM90 limits for flashinfer), two-shot above
 * (one-shot when tokens < nranks); DPTP_AR_NORM_ONLY at TP 1. */
enum dptp_ar_algo dptp_ar_choose(int nranks, size_t tokens, size_t hidden, enum dptp_dtype dt);

/* Checks one call's shape: nranks in {1,2,4,8}, hidden a positive multiple
 * of 8 and <= max hidden, tokens >= 1, tokens*hidden*elsize <= max_bytes,
 * two-shot needs tokens >= nranks. Returns 0 or -EINVAL with a message. */
int dptp_ar_validate(int nranks, size_t tokens, size_t hidden, enum dptp_dtype dt,
		     size_t max_bytes, enum dptp_ar_algo algo, struct dptp_err *err);

/* Bytes of each rank's IPC buffer for nranks and calls of at most max_bytes
 * per rank's x (3 Lamport buffers of nranks slots, the two-shot scatter and
 * gather areas, flags). 0 if nranks is out of range. */
size_t dptp_cuda_ar_buffer_bytes(int nranks, size_t max_bytes);

struct dptp_cuda_ar;	/* opaque, one per rank */

struct dptp_cuda_ar_config {
	int nranks;		/* 1, 2, 4, 8 */
	int rank;		/* 0..nranks-1: this rank's slot */
	enum dptp_dtype dtype;	/* a workspace serves one dtype (its -0.0 pattern) */
	size_t max_bytes;	/* largest tokens*hidden*elsize of a call (unused at TP 1) */
	/* Mapped address, in this process, of every rank's IPC buffer
	 * (peer_bufs[rank] is this rank's own); each >= dptp_cuda_ar_buffer_bytes. */
	void *peer_bufs[DPTP_AR_MAX_RANKS];
};

/* Initialises this rank's own buffer (Lamport areas to -0.0, flags to 0) and
 * its private device state, synchronously on the current device. Every rank
 * must have returned from create (a barrier) before any rank's first call.
 * Caller frees with dptp_cuda_ar_destroy(). */
int dptp_cuda_ar_create(const struct dptp_cuda_ar_config *cfg, struct dptp_cuda_ar **out,
			struct dptp_err *err);
void dptp_cuda_ar_destroy(struct dptp_cuda_ar *ar);	/* accepts NULL; unmaps nothing */
/* Back to the state after create (after a timeout, say), synchronously; the
 * same barrier rule applies. */
int dptp_cuda_ar_reset(struct dptp_cuda_ar *ar, struct dptp_err *err);

struct dptp_ar_args {
	const void *x;		/* [tokens][hidden] this rank's partial sums */
	const void *residual_in;/* [tokens][hidden] */
	const void *gamma;	/* [hidden] */
	void *residual_out;	/* [tokens][hidden]; may alias residual_in */
	void *norm_out;		/* [tokens][hidden] */
	size_t tokens, hidden;
	float eps;
	enum dptp_ar_algo algo;	/* DPTP_AR_AUTO: dptp_ar_choose */
	/* Upper bound on thread blocks per rank; 0 = as many as fit on the GPU
	 * at once. Must be the same on every rank (the two-shot barrier pairs
	 * blocks by index). Ranks sharing one GPU need it <= what fits / nranks. */
	int max_blocks;
	uint64_t timeout_ns;	/* bound on every wait; 0 = 10 s */
};

/* Enqueues this rank's part of the fused op on stream; every rank must make
 * the same calls in the same order. Argument errors are returned at once; a
 * timeout only shows in dptp_cuda_ar_check(). *used (may be NULL) gets the
 * algorithm that ran. */
int dptp_cuda_ar_fused(struct dptp_cuda_ar *ar, const struct dptp_ar_args *a, void *stream,
		       enum dptp_ar_algo *used, struct dptp_err *err);
/* Synchronises stream, then reads and clears the device error state:
 * 0, or -ETIMEDOUT naming what timed out (the workspace then needs
 * dptp_cuda_ar_reset on every rank). */
int dptp_cuda_ar_check(struct dptp_cuda_ar *ar, void *stream, struct dptp_err *err);

/* The unfused baseline's second half, also TP 1: residual_out = x + residual_in,
 * norm_out = rmsnorm(residual_out) * gamma, with the same rounding as the
 * fused kernels (so fused and unfused agree bit for bit on exact inputs).
 * Uses x, residual_in, gamma, residual_out, norm_out, tokens, hidden, eps,
 * max_blocks of a; max_bytes is not limited. One block per row (fewer when
 * max_blocks says so: then blocks loop over rows). Launched with
 * programmatic dependent launch: it still reads nothing before the work
 * before it on the stream is complete (before that it only asks L2 to
 * prefetch its rows of x, which cannot return stale data: L2 is where every
 * write lands), and lets a next kernel launched the same way start early
 * (that kernel must wait, cudaGridDependencySynchronize, before it reads
 * these outputs, as PDL requires). */
int dptp_cuda_residual_rmsnorm(const struct dptp_ar_args *a, enum dptp_dtype dt, void *stream,
			       struct dptp_err *err);

/* Thread blocks of one rank's fused launch that fit on the current device
 * at once (all SMs); divide by the ranks sharing a GPU for max_blocks. */
int dptp_cuda_ar_resident_blocks(enum dptp_dtype dt, size_t hidden, int nranks, int *blocks,
				 struct dptp_err *err);

/* ---- streams and events (timing for --bench) ---- */

int dptp_cuda_stream_create(void **stream, struct dptp_err *err);	/* non-blocking */
void dptp_cuda_stream_destroy(void *stream);				/* accepts NULL */
int dptp_cuda_stream_sync(void *stream, struct dptp_err *err);
/* stream waits for everything recorded in event. */
int dptp_cuda_stream_wait_event(void *stream, void *event, struct dptp_err *err);
int dptp_cuda_event_create(void **event, struct dptp_err *err);		/* timing-capable */
void dptp_cuda_event_destroy(void *event);				/* accepts NULL */
int dptp_cuda_event_record(void *event, void *stream, struct dptp_err *err);
int dptp_cuda_event_sync(void *event, struct dptp_err *err);
/* Milliseconds between two recorded, completed events. */
int dptp_cuda_event_elapsed_ms(void *start, void *end, float *ms, struct dptp_err *err);

#ifdef __cplusplus
}
#endif

#endif
