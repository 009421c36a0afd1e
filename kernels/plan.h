/* Host-side planning of the fused kernels, in plain C so that unit tests
 * without a GPU can reach it: buffer layout, launch shape, limits, the
 * one-shot/two-shot choice. Internal to kernels/ (and its tests). */
#ifndef DPTP_KERNELS_PLAN_H
#define DPTP_KERNELS_PLAN_H

#include <stddef.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Offsets inside one rank's IPC buffer, all 256-byte aligned. */
struct dptp_ar_layout {
	size_t slot_bytes;	/* one rank's x: max_bytes rounded up */
	size_t lamport[3];	/* each nranks slots of slot_bytes */
	size_t scatter;		/* nranks slots: two-shot reduce-scatter input */
	size_t gather_res;	/* one slot: residual_out rows from the slice owners */
	size_t gather_norm;	/* one slot: norm_out rows */
	size_t flags;		/* 2 barriers x DPTP_AR_MAX_BLOCKS x DPTP_AR_MAX_RANKS u32 */
	size_t total;
};

/* 0, or -EINVAL when nranks is not 1, 2, 4, 8 or max_bytes is 0 or too large. */
int dptp_ar_layout_get(int nranks, size_t max_bytes, struct dptp_ar_layout *l);

/* One thread block per token row: threads x vpt 16-byte vectors cover it. */
struct dptp_ar_shape {
	int vpt;		/* vectors per thread: 1, 2, 4, 8 */
	int threads;		/* multiple of 32, <= 512 */
	size_t hvec;		/* hidden in 16-byte vectors */
};
int dptp_ar_shape_get(size_t hidden, enum dptp_dtype dt, struct dptp_ar_shape *s);

/* The TP 1 kernel's shape: at least vpt_min (1, 2, 4, 8) vectors per thread
 * (fewer when the row has under 32 x vpt_min vectors), more when 512 threads
 * would not cover the row. */
int dptp_ar_norm_shape_get(size_t hidden, enum dptp_dtype dt, int vpt_min, struct dptp_ar_shape *s);

/* The TP 1 kernel's variants (flags), for the self-test's bench. */
#define DPTP_NORM_HINTS 1	/* loads: no L1 allocation, 256-byte L2 fetches; stores: streaming */
#define DPTP_NORM_PREFETCH 2	/* next row's loads before this row's reduction */
#define DPTP_NORM_PDL 4		/* programmatic dependent launch */
#define DPTP_NORM_PERSISTENT 8	/* grid: what fits on the GPU, not one block per row */
#define DPTP_NORM_STAGED 16	/* grid: what fits; rows kept in flight into shared memory
				 * (cp.async); the row kernel when two rows do not fit */
#define DPTP_NORM_L2PF 32	/* with PDL: the block's row of x and residual_in prefetched
				 * into L2 (one bulk prefetch each) before the PDL wait */
#define DPTP_NORM_L2PF_LINES 64	/* the same, one prefetch.global.L2 per 128-byte line */
#define DPTP_NORM_L2PF_LATE 4096	/* with PDL: the bulk prefetch of DPTP_NORM_L2PF, issued
					 * after the PDL wait; with L2PF: x before, residual after */
#define DPTP_NORM_PAIR 128	/* a row over a cluster of 2 blocks of half the threads,
				 * partial sums exchanged through distributed shared memory */
#define DPTP_NORM_BPS(n) ((n) << 8)	/* at most n blocks a SM (1..15): staged, shared memory
					 * sized for n; row kernel, unused shared memory */
#define DPTP_NORM_BPS_OF(f) (((f) >> 8) & 15)

/* What dptp_cuda_residual_rmsnorm runs, from the self-test's bench
 * (kernels/NOTES.md): one block per row, 512 x 2 vectors, PDL, the row's x
 * prefetched into L2 before the PDL wait and its residual_in after it. A
 * build may set both (-D) to run the self-test's correctness sweep on a
 * variant. */
#ifndef DPTP_NORM_VPT_MIN
#define DPTP_NORM_VPT_MIN 2
#endif
#ifndef DPTP_NORM_FLAGS
#define DPTP_NORM_FLAGS (DPTP_NORM_PDL | DPTP_NORM_L2PF | DPTP_NORM_L2PF_LATE)
#endif

/* The flags of the default launch at shape s: DPTP_NORM_FLAGS, less the L2
 * prefetches (DPTP_NORM_L2PF, _LINES, _LATE) unless s is the shape where
 * they were measured to help, 512 threads x 2 vectors (bf16/fp16 hidden
 * 8192); blocks of 256 threads lost with them (kernels/NOTES.md). */
int dptp_ar_norm_default_flags(const struct dptp_ar_shape *s);

/* Bench: the TP 1 residual + RMSNorm kernel with vpt_min vectors per thread
 * (see dptp_ar_norm_shape_get) and DPTP_NORM_* flags; otherwise as
 * dptp_cuda_residual_rmsnorm. *grid (may be NULL) gets the blocks launched. */
int dptp_cuda_residual_rmsnorm_variant(const struct dptp_ar_args *a, enum dptp_dtype dt,
				       int vpt_min, int flags, void *stream, int *grid,
				       struct dptp_err *err);

/* Blocks of one launch: one per row (one-shot/norm: tokens; two-shot: the
 * largest slice), capped by max_blocks (when > 0) and by resident (when
 * > 0: one-shot and two-shot blocks wait for peers; the norm kernel's
 * blocks loop over the rows when it is fewer), two-shot by DPTP_AR_MAX_BLOCKS. */
int dptp_ar_grid(enum dptp_ar_algo algo, int nranks, size_t tokens, int max_blocks, int resident);

/* Two-shot token slices: rows [*begin, *end) belong to rank s. */
void dptp_ar_slice(size_t tokens, int nranks, int s, size_t *begin, size_t *end);

/* One-shot limit of dptp_ar_choose, in bytes of one rank's x. */
size_t dptp_ar_oneshot_max_bytes(int nranks);

#ifdef __cplusplus
}
#endif

#endif
