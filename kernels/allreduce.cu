/* Fused allreduce + residual add + RMSNorm (one-shot Lamport, two-shot),
 * the residual + RMSNorm kernel, and -0.0 fills. See kernels.h. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_util.h"
#include "kernels.h"
#include "plan.h"

namespace cg = cooperative_groups;

namespace {

constexpr int MAXR = DPTP_AR_MAX_RANKS;
constexpr int MAXB = DPTP_AR_MAX_BLOCKS;
constexpr int THREADS_MAX = 512;
constexpr int ERR_LAMPORT = 1;	/* a one-shot read never saw a peer's data */
constexpr int ERR_BARRIER = 2;	/* a two-shot barrier never saw a peer's flag */
constexpr unsigned long long DEFAULT_TIMEOUT_NS = 10ull * 1000 * 1000 * 1000;

/* Private per-rank device state (not shared with peers). */
struct Ctrl {
	unsigned lamport_epoch;		/* one-shot calls so far: buffer = epoch % 3 */
	unsigned twoshot_epoch;		/* two-shot calls so far: flag = epoch + 1 */
	unsigned done;			/* blocks finished in the current launch */
	int error;			/* ERR_* bits */
	unsigned long long used[3];	/* elements per slot written in each Lamport buffer */
};

struct Params {
	char *bufs[MAXR];		/* every rank's IPC buffer, mapped here */
	Ctrl *ctrl;
	const uint4 *x, *res_in, *gamma;
	uint4 *res_out, *norm_out;
	size_t tokens;
	int hvec;			/* hidden in 16-byte vectors */
	int rank;
	float eps, inv_hidden;
	size_t slot_bytes, lamport[3], scatter, gather_res, gather_norm, flags;
	unsigned long long timeout_ns;
	int stages;			/* staged norm kernel: rows in shared memory per block */
};

/* ---- element types: 16-byte vectors <-> fp32 ---- */

template <typename T> struct Ops;

template <> struct Ops<float> {
	static constexpr int E = 4;
	static constexpr unsigned NZ = 0x80000000u;
	__device__ static void unpack(uint4 v, float (&f)[E])
	{
		f[0] = __uint_as_float(v.x);
		f[1] = __uint_as_float(v.y);
		f[2] = __uint_as_float(v.z);
		f[3] = __uint_as_float(v.w);
	}
	__device__ static uint4 pack(const float (&f)[E])
	{
		return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
				  __float_as_uint(f[3]));
	}
	__device__ static bool nz(unsigned w) { return w == NZ; }
	__device__ static unsigned fix(unsigned w) { return w == NZ ? 0u : w; }
};

struct Ops16Base {
	static constexpr int E = 8;
	static constexpr unsigned NZ = 0x80008000u;
	__device__ static bool nz(unsigned w)
	{
		return (w & 0xffffu) == 0x8000u || (w >> 16) == 0x8000u;
	}
	__device__ static unsigned fix(unsigned w)
	{
		if ((w & 0xffffu) == 0x8000u)
			w &= 0xffff0000u;
		if ((w >> 16) == 0x8000u)
			w &= 0x0000ffffu;
		return w;
	}
};

template <> struct Ops<__nv_bfloat16> : Ops16Base {
	__device__ static void unpack(uint4 v, float (&f)[E])
	{
		const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int i = 0; i < 4; i++) {
			f[2 * i] = __uint_as_float(w[i] << 16);
			f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
		}
	}
	__device__ static uint4 pack(const float (&f)[E])
	{
		unsigned w[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
			w[i] = *reinterpret_cast<unsigned *>(&h);
		}
		return make_uint4(w[0], w[1], w[2], w[3]);
	}
};

template <> struct Ops<__half> : Ops16Base {
	__device__ static void unpack(uint4 v, float (&f)[E])
	{
		const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
			float2 p = __half22float2(h);
			f[2 * i] = p.x;
			f[2 * i + 1] = p.y;
		}
	}
	__device__ static uint4 pack(const float (&f)[E])
	{
		unsigned w[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
			w[i] = *reinterpret_cast<unsigned *>(&h);
		}
		return make_uint4(w[0], w[1], w[2], w[3]);
	}
};

template <typename T> __device__ __forceinline__ bool has_nz(uint4 v)
{
	return Ops<T>::nz(v.x) || Ops<T>::nz(v.y) || Ops<T>::nz(v.z) || Ops<T>::nz(v.w);
}

template <typename T> __device__ __forceinline__ uint4 fix_nz(uint4 v)
{
	return make_uint4(Ops<T>::fix(v.x), Ops<T>::fix(v.y), Ops<T>::fix(v.z), Ops<T>::fix(v.w));
}

/* ---- memory access with explicit scopes ---- */

__device__ __forceinline__ uint4 ld_volatile(const uint4 *p)
{
	uint4 v;
	asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(p)
		     : "memory");
	return v;
}

__device__ __forceinline__ void st_volatile(uint4 *p, uint4 v)
{
	asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

__device__ __forceinline__ void st_release_sys(unsigned *p, unsigned v)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *p)
{
	unsigned v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ unsigned long long globaltimer()
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__device__ __forceinline__ unsigned ld_volatile_u32(const unsigned *p)
{
	return *(const volatile unsigned *)p;
}

/* Inputs read once: no L1 allocation, 256-byte L2 fetches (HINT 1), or plain. */
template <int HINT> __device__ __forceinline__ uint4 ld_once(const uint4 *p)
{
	if (!HINT)
		return *p;
	uint4 v;
	asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(p));
	return v;
}

/* Outputs written once: streaming (evict-first) stores (HINT 1), or plain. */
template <int HINT> __device__ __forceinline__ void st_once(uint4 *p, uint4 v)
{
	if (!HINT) {
		*p = v;
		return;
	}
	asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

/* Spins on a Lamport slot until it holds no -0.0, or the deadline passes
 * (then marks the error once per thread and stops waiting for good). */
template <typename T>
__device__ __forceinline__ uint4 lamport_wait(const uint4 *p, uint4 v, unsigned long long deadline,
					      bool &gave_up, Ctrl *ctrl)
{
	while (has_nz<T>(v) && !gave_up) {
		if (globaltimer() > deadline) {
			gave_up = true;
			atomicOr(&ctrl->error, ERR_LAMPORT);
			break;
		}
		v = ld_volatile(p);
	}
	return v;
}

/* ---- row math, shared by every kernel so that all agree bit for bit ---- */

/* Sum over the warp (xor butterfly); every lane gets the same value. */
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Sum over the block: warp sums added in warp order from 0.f; every thread
 * gets the same value. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
	v = warp_sum(v);
	const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
	if ((threadIdx.x & 31) == 0)
		red[warp] = v;
	__syncthreads();
	float s = 0.f;
	for (int w = 0; w < nwarps; w++)
		s += red[w];
	__syncthreads();
	return s;
}

/* f holds the allreduced x of one vector (fp32). Adds the residual, rounds
 * to T (residual_out as stored, which is what the norm sees), and adds the
 * squares to ss. Only the packed vector stays live: registers stay few. */
template <typename T>
__device__ __forceinline__ uint4 add_residual(float (&f)[Ops<T>::E], uint4 res, float &ss)
{
	constexpr int E = Ops<T>::E;
	float r[E];
	Ops<T>::unpack(res, r);
#pragma unroll
	for (int e = 0; e < E; e++)
		f[e] += r[e];
	const uint4 ro = Ops<T>::pack(f);
	Ops<T>::unpack(ro, f);
#pragma unroll
	for (int e = 0; e < E; e++)
		ss += f[e] * f[e];
	return ro;
}

/* One vector of norm_out from one of residual_out: every kernel uses this. */
template <typename T> __device__ __forceinline__ uint4 norm_vec(uint4 ro, uint4 gamma, float rstd)
{
	constexpr int E = Ops<T>::E;
	float g[E], n[E];
	Ops<T>::unpack(ro, n);
	Ops<T>::unpack(gamma, g);
#pragma unroll
	for (int e = 0; e < E; e++)
		n[e] = n[e] * rstd * g[e];
	return Ops<T>::pack(n);
}

/* gamma stays in registers across a block's rows when a thread holds few
 * vectors (loaded once per block instead of once per row); wider threads
 * read it per row through L1, which keeps them from spilling. */
template <int VPT, bool REG> struct Gamma {
	uint4 v[REG ? VPT : 1];
	__device__ __forceinline__ void load(const uint4 *gamma, int hvec)
	{
		if constexpr (REG) {
#pragma unroll
			for (int k = 0; k < VPT; k++) {
				const int idx = threadIdx.x + k * blockDim.x;
				v[k] = idx < hvec ? __ldg(gamma + idx) : make_uint4(0, 0, 0, 0);
			}
		}
	}
	__device__ __forceinline__ uint4 get(const uint4 *gamma, int k, int idx) const
	{
		if constexpr (REG)
			return v[k];
		else
			return __ldg(gamma + idx);
	}
};

/* ss is the sum of squares of the row at base (row * hvec): normalises the
 * ro vectors of thread tid (of nthr on the row) and stores both outputs;
 * with PUSH ranks (two-shot), also into every other rank's gather area. */
template <typename T, int VPT, int PUSH, bool GREG, int HINT = 0>
__device__ __forceinline__ void store_row(const Params &p, size_t base, const uint4 (&ro)[VPT],
					  float ss, const Gamma<VPT, GREG> &gm, unsigned tid, unsigned nthr)
{
	const float rstd = rsqrtf(ss * p.inv_hidden + p.eps);
#pragma unroll
	for (int k = 0; k < VPT; k++) {
		const int idx = tid + k * nthr;
		if (idx < p.hvec) {
			const uint4 no = norm_vec<T>(ro[k], gm.get(p.gamma, k, idx), rstd);
			st_once<HINT>(p.res_out + base + idx, ro[k]);
			st_once<HINT>(p.norm_out + base + idx, no);
#pragma unroll
			for (int q = 0; q < PUSH; q++) {
				if (q == p.rank)
					continue;
				reinterpret_cast<uint4 *>(p.bufs[q] + p.gather_res)[base + idx] = ro[k];
				reinterpret_cast<uint4 *>(p.bufs[q] + p.gather_norm)[base + idx] = no;
			}
		}
	}
}

/* Reduces ss over the block, then store_row. */
template <typename T, int VPT, int PUSH, bool GREG, int HINT = 0>
__device__ __forceinline__ void finish_row(const Params &p, size_t row, const uint4 (&ro)[VPT],
					   float ss, float *red, const Gamma<VPT, GREG> &gm)
{
	const size_t base = row * (size_t)p.hvec;
	ss = block_sum(ss, red);
	store_row<T, VPT, PUSH, GREG, HINT>(p, base, ro, ss, gm, threadIdx.x, blockDim.x);
}

/* The last block to finish runs fn (the state update for the next call). */
template <typename F> __device__ __forceinline__ void last_block(Ctrl *ctrl, F fn)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		unsigned prev = atomicAdd(&ctrl->done, 1u);
		if (prev == gridDim.x - 1) {
			ctrl->done = 0;
			fn();
			__threadfence();
		}
	}
}

/* ---- residual + RMSNorm (TP 1, and the unfused baseline) ---- */

/* PDL (DPTP_NORM_PDL in F): wait for the work before us on the stream to be
 * complete and visible, then let the next kernel's blocks be scheduled. */
template <int F> __device__ __forceinline__ void pdl_enter()
{
	if constexpr ((F & DPTP_NORM_PDL) != 0) {
		asm volatile("griddepcontrol.wait;" ::: "memory");
		asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
	}
}

/* bytes (a multiple of 16) at src (16-byte aligned) into L2: one
 * instruction, the SM's bulk-copy unit fetches them; nothing returns. */
__device__ __forceinline__ void bulk_prefetch_l2(const void *src, unsigned bytes)
{
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

/* residual_in of row into L2 when row < end (thread 0): the fused kernels
 * issue it at their start, before they wait for peers. Safe: residual_in is
 * this rank's own input, complete before the launch (no PDL there), never
 * written by a peer. */
__device__ __forceinline__ void prefetch_res_row(const Params &p, size_t row, size_t end)
{
	if (threadIdx.x == 0 && row < end)
		bulk_prefetch_l2(p.res_in + row * (size_t)p.hvec, (unsigned)p.hvec * 16u);
}

/* DPTP_NORM_L2PF or DPTP_NORM_L2PF_LINES in F, with DPTP_NORM_PDL: x and
 * residual_in of row into L2, issued BEFORE the PDL wait, so that the
 * blocks that become resident while the previous grid drains keep HBM busy
 * (L2PF: one cp.async.bulk.prefetch.L2 per tensor, threads 0 and 32 of the
 * row; LINES: one prefetch.global.L2 per 128-byte line, from the thread that
 * owns the line's first vector, tid of nthr on the row). W: which tensors,
 * 1 x, 2 residual_in, 3 both (norm_kernel calls it after the wait for
 * DPTP_NORM_L2PF_LATE: both alone, residual_in with L2PF). Safe before the
 * wait: a prefetch only fills L2 and returns nothing to the thread; L2 is
 * the GPU's point of coherence for its memory, where every write lands
 * (this GPU's SMs, and peers' writes over NVLink too), so a line fetched
 * before the previous kernel writes it is updated in L2 by that write; the
 * loads themselves come after the wait, and bypass nothing: L1 holds no
 * line of this row before them. */
template <int F, int W = 3>
__device__ __forceinline__ void l2_prefetch_row(const Params &p, size_t row, unsigned tid,
						unsigned nthr)
{
	if constexpr (W == 0 || !(F & DPTP_NORM_PDL)) {
		return;
	} else if constexpr (F & (DPTP_NORM_L2PF | DPTP_NORM_L2PF_LATE)) {
		if (row < p.tokens && (((W & 1) && tid == 0) || ((W & 2) && tid == 32)))
			bulk_prefetch_l2((tid == 0 ? p.x : p.res_in) + row * (size_t)p.hvec,
					 (unsigned)p.hvec * 16u);
	} else if constexpr ((F & DPTP_NORM_L2PF_LINES) != 0) {
		if (row >= p.tokens)
			return;
		const size_t base = row * (size_t)p.hvec;
		for (unsigned i = tid; i < (unsigned)p.hvec; i += nthr) {
			const uint4 *a[2] = {p.x + base + i, p.res_in + base + i};
#pragma unroll
			for (int j = 0; j < 2; j++)
				if (i == 0 || ((uintptr_t)a[j] & 127u) == 0)
					asm volatile("prefetch.global.L2 [%0];" ::"l"(a[j]) : "memory");
		}
	}
}

/* residual_out of one row into ro, vector by vector from lx(k, idx) (x)
 * and lr(k, idx) (residual_in), for thread tid of nthr on the row; returns
 * this thread's sum of squares. */
template <typename T, int VPT, typename LX, typename LR>
__device__ __forceinline__ float add_row(int hvec, unsigned tid, unsigned nthr, uint4 (&ro)[VPT], LX lx,
					 LR lr)
{
	constexpr int E = Ops<T>::E;
	float ss = 0.f;
#pragma unroll
	for (int k = 0; k < VPT; k++) {
		const int idx = tid + k * nthr;
		if (idx < hvec) {
			float f[E];
			Ops<T>::unpack(lx(k, idx), f);
			ro[k] = add_residual<T>(f, lr(k, idx), ss);
		}
	}
	return ss;
}

/* x and residual_in of one row into registers (16-byte loads, all issued
 * before any is used). */
template <int VPT, int HINT>
__device__ __forceinline__ void load_row(const Params &p, size_t row, uint4 (&x)[VPT],
					 uint4 (&r)[VPT])
{
	const size_t base = row * (size_t)p.hvec;
#pragma unroll
	for (int k = 0; k < VPT; k++) {
		const int idx = threadIdx.x + k * blockDim.x;
		if (idx < p.hvec) {
			x[k] = ld_once<HINT>(p.x + base + idx);
			r[k] = ld_once<HINT>(p.res_in + base + idx);
		}
	}
}

/* A block takes rows blockIdx.x, +gridDim.x, ... (one row when the grid is
 * one block per row). F: DPTP_NORM_HINTS (ld_once/st_once hints),
 * DPTP_NORM_PREFETCH (the next row's loads issued before this row's block
 * reduction and stores, and gamma read once per block; only up to 4
 * vectors per thread: 8 would spill holding two rows), DPTP_NORM_PDL
 * (programmatic dependent launch: wait for the previous kernel's memory at
 * the start, let the next kernel's blocks be scheduled once all of ours
 * are), DPTP_NORM_L2PF(_LINES) (with PDL: the first row prefetched into L2
 * before the wait; DPTP_NORM_L2PF_LATE: after it). One pass over each row:
 * it stays in registers. */
template <typename T, int VPT, int F>
__global__ void __launch_bounds__(THREADS_MAX) norm_kernel(Params p)
{
	constexpr int HINT = (F & DPTP_NORM_HINTS) ? 1 : 0;
	constexpr bool PREFETCH = (F & DPTP_NORM_PREFETCH) && VPT <= 4;
	/* L2 prefetches before / after the PDL wait (l2_prefetch_row's W) */
	constexpr int PF = (F & (DPTP_NORM_L2PF | DPTP_NORM_L2PF_LINES)) ? 3 : 0;
	constexpr int BEFORE = (F & DPTP_NORM_L2PF_LATE) ? PF & 1 : PF;
	constexpr int AFTER = (F & DPTP_NORM_L2PF_LATE) ? 3 & ~BEFORE : 0;
	__shared__ float red[32];
	l2_prefetch_row<F, BEFORE>(p, blockIdx.x, threadIdx.x, blockDim.x);
	pdl_enter<F>();
	l2_prefetch_row<F, AFTER>(p, blockIdx.x, threadIdx.x, blockDim.x);
	size_t row = blockIdx.x;
	if (row >= p.tokens)
		return;
	Gamma<VPT, PREFETCH> gm;
	gm.load(p.gamma, p.hvec);
	uint4 xa[VPT], ra[VPT];
	if (PREFETCH)
		load_row<VPT, HINT>(p, row, xa, ra);
	for (;;) {
		const size_t base = row * (size_t)p.hvec, next = row + gridDim.x;
		uint4 ro[VPT];
		/* without prefetch, vector by vector: all up front spills at 8 */
		const float ss = add_row<T, VPT>(
			p.hvec, threadIdx.x, blockDim.x, ro,
			[&](int k, int idx) { return PREFETCH ? xa[k] : ld_once<HINT>(p.x + base + idx); },
			[&](int k, int idx) {
				return PREFETCH ? ra[k] : ld_once<HINT>(p.res_in + base + idx);
			});
		if (PREFETCH && next < p.tokens)
			load_row<VPT, HINT>(p, next, xa, ra);
		finish_row<T, VPT, 0, PREFETCH, HINT>(p, row, ro, ss, red, gm);
		if (next >= p.tokens)
			break;
		row = next;
	}
}

/* DPTP_NORM_PAIR: one row over a cluster of 2 blocks of half the row
 * kernel's threads (more, smaller blocks to schedule). Block h (its rank in
 * the cluster) is threads h * blockDim.x.. of the row kernel's block: the
 * same vectors in the same order per thread. The warp sums of both blocks
 * are read through distributed shared memory in warp order, from 0.f, as
 * block_sum adds them: the row's sum, and every output bit, are the row
 * kernel's. F: DPTP_NORM_PDL, DPTP_NORM_L2PF. */
template <typename T, int VPT, int F>
__global__ void __launch_bounds__(THREADS_MAX / 2) norm_pair_kernel(Params p)
{
	__shared__ float red[THREADS_MAX / 64];
	cg::cluster_group cl = cg::this_cluster();
	const unsigned tid = cl.block_rank() * blockDim.x + threadIdx.x, nthr = 2 * blockDim.x;
	const size_t row = blockIdx.x >> 1, base = row * (size_t)p.hvec;
	l2_prefetch_row<F>(p, row, tid, nthr);
	pdl_enter<F>();
	uint4 ro[VPT];
	const float ss = warp_sum(add_row<T, VPT>(
		p.hvec, tid, nthr, ro, [&](int, int idx) { return p.x[base + idx]; },
		[&](int, int idx) { return p.res_in[base + idx]; }));
	const int nwarps = blockDim.x >> 5;
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	cl.sync();
	float s = 0.f;
	for (int h = 0; h < 2; h++) {
		const float *r = cl.map_shared_rank(red, h);
		for (int w = 0; w < nwarps; w++)
			s += r[w];
	}
	cl.sync(); /* the other block has read our red: it may exit */
	Gamma<VPT, false> gm;
	store_row<T, VPT, 0, false>(p, base, ro, s, gm, tid, nthr);
}

/* 16 bytes global -> shared without registers (cp.async, L2 only; HINT 1:
 * 256-byte L2 fetches). */
template <int HINT> __device__ __forceinline__ void cp_async16(uint4 *smem, const uint4 *gmem)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	if (HINT)
		asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(s), "l"(gmem)
			     : "memory");
	else
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

/* Waits until at most n (0..7) of this thread's cp.async groups are pending;
 * the wait takes an immediate, n is the same in every thread. */
__device__ __forceinline__ void cp_async_wait_pending(int n)
{
	switch (n) {
	case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
	case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
	case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
	case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
	case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
	case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
	case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
	default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
	}
}

/* x and residual_in of one row into stage b of shared memory (each thread
 * its own vectors, so only it reads them back: no block barrier), as one
 * cp.async group; an empty group past the last row keeps the count. */
template <int VPT, int HINT>
__device__ __forceinline__ void stage_row(const Params &p, size_t row, uint4 *st, int b)
{
	if (row < p.tokens) {
		uint4 *sx = st + (size_t)b * 2 * p.hvec, *sr = sx + p.hvec;
		const size_t base = row * (size_t)p.hvec;
#pragma unroll
		for (int k = 0; k < VPT; k++) {
			const int idx = threadIdx.x + k * blockDim.x;
			if (idx < p.hvec) {
				cp_async16<HINT>(sx + idx, p.x + base + idx);
				cp_async16<HINT>(sr + idx, p.res_in + base + idx);
			}
		}
	}
	asm volatile("cp.async.commit_group;" ::: "memory");
}

/* DPTP_NORM_STAGED: what fits on the GPU, each block keeping p.stages rows
 * (2..8) of x and residual_in in flight into shared memory by cp.async, so
 * that loads never wait for a block's reduction or for a new block to
 * start, and registers hold one row. Rows blockIdx.x, +gridDim.x, ...;
 * the same row math as norm_kernel (bit-identical). F: DPTP_NORM_HINTS
 * (256-byte L2 fetches, streaming stores), DPTP_NORM_PDL. */
template <typename T, int VPT, int F>
__global__ void __launch_bounds__(THREADS_MAX) norm_staged_kernel(Params p)
{
	constexpr int HINT = (F & DPTP_NORM_HINTS) ? 1 : 0;
	constexpr bool GREG = VPT <= 4;
	extern __shared__ uint4 st[];
	__shared__ float red[32];
	pdl_enter<F>();
	const int S = p.stages;
	size_t row = blockIdx.x;
	for (int b = 0; b < S; b++)
		stage_row<VPT, HINT>(p, row + (size_t)b * gridDim.x, st, b);
	Gamma<VPT, GREG> gm;
	gm.load(p.gamma, p.hvec);
	for (int b = 0; row < p.tokens; row += gridDim.x) {
		cp_async_wait_pending(S - 1);
		const uint4 *sx = st + (size_t)b * 2 * p.hvec, *sr = sx + p.hvec;
		uint4 ro[VPT];
		const float ss = add_row<T, VPT>(
			p.hvec, threadIdx.x, blockDim.x, ro, [&](int, int idx) { return sx[idx]; },
			[&](int, int idx) { return sr[idx]; });
		finish_row<T, VPT, 0, GREG, HINT>(p, row, ro, ss, red, gm);
		/* stage b is in registers (the block sum used it): refill it */
		stage_row<VPT, HINT>(p, row + (size_t)S * gridDim.x, st, b);
		b = b + 1 == S ? 0 : b + 1;
	}
}

/* ---- one-shot: Lamport ---- */

template <typename T, int N, int VPT>
__global__ void __launch_bounds__(THREADS_MAX, 1) oneshot_kernel(Params p)
{
	constexpr int E = Ops<T>::E;
	__shared__ float red[32];
	Ctrl *ctrl = p.ctrl;
	const unsigned long long deadline = globaltimer() + p.timeout_ns;
	bool gave_up = false;
	const unsigned ep = ld_volatile_u32(&ctrl->lamport_epoch);
	const int cur = ep % 3, old = (ep + 1) % 3;
	const unsigned long long clear_elems =
		*(const volatile unsigned long long *)&ctrl->used[old];
	const size_t slot_vecs = p.slot_bytes / 16;
	prefetch_res_row(p, blockIdx.x, p.tokens); /* read in 3., after the exchange */

	/* 1. Clear our buffer of two calls ago (peers write it next call). Each
	 * block clears, then fences, and only then publishes data: a peer that
	 * has seen all our data of this call has seen the clear too. */
	{
		uint4 *own = reinterpret_cast<uint4 *>(p.bufs[p.rank] + p.lamport[old]);
		const size_t cv = clear_elems / E, total = cv * N;
		const uint4 nzv = make_uint4(Ops<T>::NZ, Ops<T>::NZ, Ops<T>::NZ, Ops<T>::NZ);
		for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
		     i += (size_t)gridDim.x * blockDim.x) {
			const size_t s = i / cv, o = i - s * cv;
			own[s * slot_vecs + o] = nzv;
		}
		if (total) {
			__syncthreads();
			if (threadIdx.x == 0)
				__threadfence_system();
		}
		__syncthreads();
	}

	/* 2. Push x (-0.0 made +0.0) into slot `rank` of every rank's buffer. */
	for (size_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
		const size_t base = row * (size_t)p.hvec;
#pragma unroll
		for (int k = 0; k < VPT; k++) {
			const int idx = threadIdx.x + k * blockDim.x;
			if (idx < p.hvec) {
				const uint4 v = fix_nz<T>(p.x[base + idx]);
#pragma unroll
				for (int q = 0; q < N; q++) {
					uint4 *dst = reinterpret_cast<uint4 *>(
						p.bufs[q] + p.lamport[cur] + (size_t)p.rank * p.slot_bytes);
					st_volatile(dst + base + idx, v);
				}
			}
		}
	}

	/* 3. Read every slot of our buffer until no -0.0 is left; sum in rank order. */
	Gamma<VPT, (VPT <= 2)> gm;
	gm.load(p.gamma, p.hvec);
	const uint4 *mine = reinterpret_cast<const uint4 *>(p.bufs[p.rank] + p.lamport[cur]);
	for (size_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
		const size_t base = row * (size_t)p.hvec;
		uint4 ro[VPT];
		float ss = 0.f;
#pragma unroll
		for (int k = 0; k < VPT; k++) {
			const int idx = threadIdx.x + k * blockDim.x;
			if (idx < p.hvec) {
				uint4 v[N];
#pragma unroll
				for (int q = 0; q < N; q++)
					v[q] = ld_volatile(mine + q * slot_vecs + base + idx);
				float f[E];
#pragma unroll
				for (int e = 0; e < E; e++)
					f[e] = 0.f;
#pragma unroll
				for (int q = 0; q < N; q++) {
					v[q] = lamport_wait<T>(mine + q * slot_vecs + base + idx, v[q],
							       deadline, gave_up, ctrl);
					float g[E];
					Ops<T>::unpack(v[q], g);
#pragma unroll
					for (int e = 0; e < E; e++)
						f[e] += g[e];
				}
				ro[k] = add_residual<T>(f, p.res_in[base + idx], ss);
			}
		}
		finish_row<T, VPT, 0>(p, row, ro, ss, red, gm);
	}

	const unsigned long long elems = (unsigned long long)p.tokens * p.hvec * E;
	last_block(ctrl, [&] {
		ctrl->used[cur] = elems;
		ctrl->lamport_epoch = ep + 1;
	});
}

/* ---- two-shot: reduce-scatter, barrier, norm on the slice, all-gather ---- */

__device__ __forceinline__ void slice_of(size_t tokens, int n, int s, size_t &b, size_t &e)
{
	b = tokens * (size_t)s / (size_t)n;
	e = tokens * (size_t)(s + 1) / (size_t)n;
}

/* Block b of every rank meets block b of every other rank. Block b's rows
 * (i = b mod grid within each slice) are the same on all ranks, so pairing
 * blocks by index is enough to order the data they exchange. */
template <int N>
__device__ __forceinline__ void barrier(const Params &p, int which, unsigned flag,
					unsigned long long deadline, bool &gave_up)
{
	__syncthreads();
	if (threadIdx.x < N) {
		const size_t slot = ((size_t)which * MAXB + blockIdx.x) * MAXR;
		unsigned *remote = reinterpret_cast<unsigned *>(p.bufs[threadIdx.x] + p.flags) + slot +
				   p.rank;
		__threadfence_system();
		st_release_sys(remote, flag);
		const unsigned *mine = reinterpret_cast<const unsigned *>(p.bufs[p.rank] + p.flags) +
				       slot + threadIdx.x;
		while (!gave_up && ld_acquire_sys(mine) != flag) {
			if (globaltimer() > deadline) {
				gave_up = true;
				atomicOr(&p.ctrl->error, ERR_BARRIER);
			}
		}
	}
	__syncthreads();
}

template <typename T, int N, int VPT>
__global__ void __launch_bounds__(THREADS_MAX, 1) twoshot_kernel(Params p)
{
	constexpr int E = Ops<T>::E;
	__shared__ float red[32];
	Ctrl *ctrl = p.ctrl;
	const unsigned long long deadline = globaltimer() + p.timeout_ns;
	bool gave_up = false;
	const unsigned ep = ld_volatile_u32(&ctrl->twoshot_epoch);
	const unsigned flag = ep % 0xfffffffeu + 1u; /* never 0, never last call's */
	const size_t slot_vecs = p.slot_bytes / 16;
	{
		size_t b, e; /* our slice's first row of this block: read in 2. */
		slice_of(p.tokens, N, p.rank, b, e);
		prefetch_res_row(p, b + blockIdx.x, e);
	}

	/* 1. Scatter: rows of slice s go to slot `rank` of rank s's scatter area. */
	for (int s = 0; s < N; s++) {
		size_t b, e;
		slice_of(p.tokens, N, s, b, e);
		uint4 *dst = reinterpret_cast<uint4 *>(p.bufs[s] + p.scatter) + (size_t)p.rank * slot_vecs;
		for (size_t row = b + blockIdx.x; row < e; row += gridDim.x) {
			const size_t base = row * (size_t)p.hvec;
#pragma unroll
			for (int k = 0; k < VPT; k++) {
				const int idx = threadIdx.x + k * blockDim.x;
				if (idx < p.hvec)
					dst[base + idx] = p.x[base + idx];
			}
		}
	}
	barrier<N>(p, 0, flag, deadline, gave_up);

	/* 2. Reduce our slice in rank order, residual + norm, push to every rank. */
	{
		size_t b, e;
		slice_of(p.tokens, N, p.rank, b, e);
		const uint4 *in = reinterpret_cast<const uint4 *>(p.bufs[p.rank] + p.scatter);
		Gamma<VPT, (VPT <= 2)> gm;
		gm.load(p.gamma, p.hvec);
		for (size_t row = b + blockIdx.x; row < e; row += gridDim.x) {
			const size_t base = row * (size_t)p.hvec;
			uint4 ro[VPT];
			float ss = 0.f;
#pragma unroll
			for (int k = 0; k < VPT; k++) {
				const int idx = threadIdx.x + k * blockDim.x;
				if (idx < p.hvec) {
					uint4 v[N];
#pragma unroll
					for (int q = 0; q < N; q++)
						v[q] = __ldcg(in + q * slot_vecs + base + idx);
					float f[E];
#pragma unroll
					for (int e2 = 0; e2 < E; e2++)
						f[e2] = 0.f;
#pragma unroll
					for (int q = 0; q < N; q++) {
						float g[E];
						Ops<T>::unpack(v[q], g);
#pragma unroll
						for (int e2 = 0; e2 < E; e2++)
							f[e2] += g[e2];
					}
					ro[k] = add_residual<T>(f, p.res_in[base + idx], ss);
				}
			}
			finish_row<T, VPT, N>(p, row, ro, ss, red, gm);
		}
	}
	barrier<N>(p, 1, flag, deadline, gave_up);

	/* 3. Gather: the other slices arrived in our gather area. */
	{
		const uint4 *gr = reinterpret_cast<const uint4 *>(p.bufs[p.rank] + p.gather_res);
		const uint4 *gn = reinterpret_cast<const uint4 *>(p.bufs[p.rank] + p.gather_norm);
		for (int s = 0; s < N; s++) {
			if (s == p.rank)
				continue;
			size_t b, e;
			slice_of(p.tokens, N, s, b, e);
			for (size_t row = b + blockIdx.x; row < e; row += gridDim.x) {
				const size_t base = row * (size_t)p.hvec;
#pragma unroll
				for (int k = 0; k < VPT; k++) {
					const int idx = threadIdx.x + k * blockDim.x;
					if (idx < p.hvec) {
						const uint4 r = __ldcg(gr + base + idx);
						const uint4 n = __ldcg(gn + base + idx);
						p.res_out[base + idx] = r;
						p.norm_out[base + idx] = n;
					}
				}
			}
		}
	}

	last_block(ctrl, [&] { ctrl->twoshot_epoch = ep + 1; });
}

/* ---- -0.0 fill ---- */

__global__ void fill_u32_kernel(unsigned *p, size_t n, unsigned v)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

__global__ void fill_u16_kernel(unsigned short *p, unsigned short v)
{
	*p = v;
}

/* ---- kernel table ---- */

/* The TP 1 kernel's launch (plan.h). */
constexpr int NORM_VPT_MIN = DPTP_NORM_VPT_MIN;
constexpr int NORM_DEFAULT = -1; /* norm_launch's flags: dptp_ar_norm_default_flags */

template <typename T, int N, int VPT> const void *kernel_of(enum dptp_ar_algo a)
{
	switch (a) {
	case DPTP_AR_ONESHOT: return (const void *)oneshot_kernel<T, N, VPT>;
	case DPTP_AR_TWOSHOT: return (const void *)twoshot_kernel<T, N, VPT>;
	default: return NULL;
	}
}

template <typename T, int N> const void *by_vpt(enum dptp_ar_algo a, int vpt)
{
	switch (vpt) {
	case 1: return kernel_of<T, N, 1>(a);
	case 2: return kernel_of<T, N, 2>(a);
	case 4: return kernel_of<T, N, 4>(a);
	case 8: return kernel_of<T, N, 8>(a);
	default: return NULL;
	}
}

template <typename T> const void *by_ranks(enum dptp_ar_algo a, int n, int vpt)
{
	switch (n) {
	case 2: return by_vpt<T, 2>(a, vpt);
	case 4: return by_vpt<T, 4>(a, vpt);
	case 8: return by_vpt<T, 8>(a, vpt);
	default: return NULL;
	}
}

/* The TP 1 kernels by vectors per thread (K: RowK or StagedK). */
template <typename T, int V, int F> struct RowK {
	static const void *fn() { return (const void *)norm_kernel<T, V, F>; }
};
template <typename T, int V, int F> struct StagedK {
	static const void *fn() { return (const void *)norm_staged_kernel<T, V, F>; }
};
template <typename T, int V, int F> struct PairK {
	static const void *fn() { return (const void *)norm_pair_kernel<T, V, F>; }
};

template <template <typename, int, int> class K, typename T, int F> const void *norm_by_vpt(int vpt)
{
	switch (vpt) {
	case 1: return K<T, 1, F>::fn();
	case 2: return K<T, 2, F>::fn();
	case 4: return K<T, 4, F>::fn();
	case 8: return K<T, 8, F>::fn();
	default: return NULL;
	}
}

/* The L2 prefetches only with PDL (without the wait there is nothing to
 * overlap); other combinations have no kernel (NULL). */
constexpr int L2PF = DPTP_NORM_PDL | DPTP_NORM_L2PF, L2PF_LINES = DPTP_NORM_PDL | DPTP_NORM_L2PF_LINES,
	      L2PF_LATE = DPTP_NORM_PDL | DPTP_NORM_L2PF_LATE, L2PF_SPLIT = L2PF | DPTP_NORM_L2PF_LATE;

template <typename T> const void *norm_by_flags(int vpt, int f)
{
	switch (f & (DPTP_NORM_HINTS | DPTP_NORM_PREFETCH | DPTP_NORM_PDL | DPTP_NORM_L2PF |
		     DPTP_NORM_L2PF_LINES | DPTP_NORM_L2PF_LATE)) {
	case 0: return norm_by_vpt<RowK, T, 0>(vpt);
	case 1: return norm_by_vpt<RowK, T, 1>(vpt);
	case 2: return norm_by_vpt<RowK, T, 2>(vpt);
	case 3: return norm_by_vpt<RowK, T, 3>(vpt);
	case 4: return norm_by_vpt<RowK, T, 4>(vpt);
	case 5: return norm_by_vpt<RowK, T, 5>(vpt);
	case 6: return norm_by_vpt<RowK, T, 6>(vpt);
	case 7: return norm_by_vpt<RowK, T, 7>(vpt);
	case L2PF: return norm_by_vpt<RowK, T, L2PF>(vpt);
	case L2PF_LINES: return norm_by_vpt<RowK, T, L2PF_LINES>(vpt);
	case L2PF_LATE: return norm_by_vpt<RowK, T, L2PF_LATE>(vpt);
	case L2PF_SPLIT: return norm_by_vpt<RowK, T, L2PF_SPLIT>(vpt);
	default: return NULL;
	}
}

/* The cluster-pair kernel: PDL, with or without the bulk L2 prefetch. */
template <typename T> const void *pair_by_flags(int vpt, int f)
{
	switch (f & (DPTP_NORM_HINTS | DPTP_NORM_PREFETCH | DPTP_NORM_PDL | DPTP_NORM_L2PF |
		     DPTP_NORM_L2PF_LINES | DPTP_NORM_L2PF_LATE)) {
	case DPTP_NORM_PDL: return norm_by_vpt<PairK, T, DPTP_NORM_PDL>(vpt);
	case L2PF: return norm_by_vpt<PairK, T, L2PF>(vpt);
	default: return NULL;
	}
}

/* The staged kernel has no prefetch (its rows are in flight already). */
template <typename T> const void *staged_by_flags(int vpt, int f)
{
	switch (f & (DPTP_NORM_HINTS | DPTP_NORM_PDL)) {
	case 0: return norm_by_vpt<StagedK, T, 0>(vpt);
	case DPTP_NORM_HINTS: return norm_by_vpt<StagedK, T, DPTP_NORM_HINTS>(vpt);
	case DPTP_NORM_PDL: return norm_by_vpt<StagedK, T, DPTP_NORM_PDL>(vpt);
	default: return norm_by_vpt<StagedK, T, DPTP_NORM_HINTS | DPTP_NORM_PDL>(vpt);
	}
}

template <typename T> const void *norm_of(int vpt, int flags)
{
	if (flags & DPTP_NORM_STAGED)
		return staged_by_flags<T>(vpt, flags);
	if (flags & DPTP_NORM_PAIR)
		return pair_by_flags<T>(vpt, flags);
	return norm_by_flags<T>(vpt, flags);
}

/* The row kernel, the staged one (DPTP_NORM_STAGED) or the cluster pair
 * (DPTP_NORM_PAIR). */
const void *norm_for(enum dptp_dtype dt, int vpt, int flags)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: return norm_of<float>(vpt, flags);
	case DPTP_DTYPE_FP16: return norm_of<__half>(vpt, flags);
	case DPTP_DTYPE_BF16: return norm_of<__nv_bfloat16>(vpt, flags);
	}
	return NULL;
}

/* One-shot and two-shot; n 2, 4, 8. */
const void *kernel_for(enum dptp_ar_algo a, enum dptp_dtype dt, int n, int vpt)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: return by_ranks<float>(a, n, vpt);
	case DPTP_DTYPE_FP16: return by_ranks<__half>(a, n, vpt);
	case DPTP_DTYPE_BF16: return by_ranks<__nv_bfloat16>(a, n, vpt);
	}
	return NULL;
}

int resident_of(const void *fn, int threads, size_t smem, int *blocks, struct dptp_err *err)
{
	int dev = 0, sms = 0, per_sm = 0;
	DPTP_CU_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
	DPTP_CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err,
		    "cudaDeviceGetAttribute");
	DPTP_CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem), err,
		    "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
	*blocks = per_sm * sms;
	return 0;
}

/* resident_of, remembered per kernel, block size, dynamic shared memory and
 * device (the TP 1 kernel asks on every call). A kernel given dynamic
 * shared memory is first allowed all that the device lets a block have,
 * once, so that any later size fits too. */
int resident_cached(const void *fn, int threads, size_t smem, int *blocks, struct dptp_err *err)
{
	static thread_local struct {
		const void *fn;
		size_t smem;
		int threads, dev, blocks;
	} cache[8];
	static thread_local unsigned next;
	int dev = 0;
	DPTP_CU_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
	for (auto &c : cache)
		if (c.fn == fn && c.threads == threads && c.smem == smem && c.dev == dev) {
			*blocks = c.blocks;
			return 0;
		}
	if (smem) {
		int optin = 0;
		cudaFuncAttributes fa;
		DPTP_CU_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
			    err, "cudaDeviceGetAttribute");
		DPTP_CU_TRY(cudaFuncGetAttributes(&fa, fn), err, "cudaFuncGetAttributes");
		DPTP_CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
						 optin - (int)fa.sharedSizeBytes),
			    err, "cudaFuncSetAttribute");
	}
	int rc = resident_of(fn, threads, smem, blocks, err);
	if (rc)
		return rc;
	auto &c = cache[next++ % 8];
	c.fn = fn;
	c.threads = threads;
	c.smem = smem;
	c.dev = dev;
	c.blocks = *blocks;
	return 0;
}

/* Shared memory a block may have when n blocks share a SM (0 when n is 0). */
int smem_for_blocks(int n, long *bytes, struct dptp_err *err)
{
	static thread_local int cdev = -1, per_sm, optin, reserved;
	int dev = 0;
	*bytes = 0;
	if (n <= 0)
		return 0;
	DPTP_CU_TRY(cudaGetDevice(&dev), err, "cudaGetDevice");
	if (dev != cdev) {
		DPTP_CU_TRY(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
						   dev), err, "cudaDeviceGetAttribute");
		DPTP_CU_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
			    err, "cudaDeviceGetAttribute");
		DPTP_CU_TRY(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock,
						   dev), err, "cudaDeviceGetAttribute");
		cdev = dev;
	}
	long avail = per_sm / n - reserved;
	if (avail > optin)
		avail = optin;
	avail -= 256; /* the block's static shared memory */
	*bytes = avail > 0 ? avail : 0;
	return 0;
}

/* Shared memory of one launch of the TP 1 kernel. Staged: *stages rows
 * (2..8) per block, sized for DPTP_NORM_BPS_OF(flags) blocks a SM (1 when
 * 0), or *stages 0 when two rows do not fit (then the row kernel runs).
 * The row kernel with DPTP_NORM_BPS(n): unused shared memory that keeps
 * it to n blocks a SM (fewer rows in flight at once). */
int norm_smem(size_t hvec, int flags, int *stages, size_t *smem, struct dptp_err *err)
{
	const int bps = DPTP_NORM_BPS_OF(flags);
	long avail = 0;
	*stages = 0;
	*smem = 0;
	int rc = smem_for_blocks((flags & DPTP_NORM_STAGED) && !bps ? 1 : bps, &avail, err);
	if (rc)
		return rc;
	if (!(flags & DPTP_NORM_STAGED)) {
		*smem = (size_t)avail;
		return 0;
	}
	const long row = (long)hvec * 2 * 16;
	const long n = avail / row;
	*stages = n < 2 ? 0 : n > 8 ? 8 : (int)n;
	*smem = (size_t)*stages * (size_t)row;
	return 0;
}

bool aligned16(const void *p)
{
	return ((uintptr_t)p & 15u) == 0;
}

int check_ptrs(const struct dptp_ar_args *a, struct dptp_err *err)
{
	if (!a->x || !a->residual_in || !a->gamma || !a->residual_out || !a->norm_out)
		return dptp_kerr(err, -EINVAL, "fused allreduce: a buffer is NULL");
	if (!aligned16(a->x) || !aligned16(a->residual_in) || !aligned16(a->gamma) ||
	    !aligned16(a->residual_out) || !aligned16(a->norm_out))
		return dptp_kerr(err, -EINVAL, "fused allreduce: buffers must be 16-byte aligned");
	return 0;
}

void fill_common(Params &k, const struct dptp_ar_args *a, enum dptp_dtype dt,
		 const struct dptp_ar_shape &sh)
{
	k.x = (const uint4 *)a->x;
	k.res_in = (const uint4 *)a->residual_in;
	k.gamma = (const uint4 *)a->gamma;
	k.res_out = (uint4 *)a->residual_out;
	k.norm_out = (uint4 *)a->norm_out;
	k.tokens = a->tokens;
	k.hvec = (int)sh.hvec;
	k.eps = a->eps;
	k.inv_hidden = 1.0f / (float)a->hidden;
	k.timeout_ns = a->timeout_ns ? a->timeout_ns : DEFAULT_TIMEOUT_NS;
	(void)dt;
}

int launch(const void *fn, int grid, int threads, Params &k, cudaStream_t s,
	   struct dptp_err *err)
{
	void *args[] = {&k};
	DPTP_CU_TRY(cudaLaunchKernel(fn, dim3(grid), dim3(threads), args, 0, s), err,
		    "cudaLaunchKernel");
	return 0;
}

} // namespace

struct dptp_cuda_ar {
	struct dptp_cuda_ar_config cfg;
	struct dptp_ar_layout lay;
	Ctrl *ctrl;
	int device;
	size_t cached_hidden;
	int cached_resident[2];	/* oneshot, twoshot */
};

int dptp_cuda_fill_neg_zero(void *dptr, size_t count, enum dptp_dtype dt, void *stream,
			    struct dptp_err *err)
{
	cudaStream_t s = (cudaStream_t)stream;
	size_t bytes = count * dptp_dtype_bytes(dt);
	if (((uintptr_t)dptr & 3u) != 0)
		return dptp_kerr(err, -EINVAL, "fill -0.0: pointer not 4-byte aligned");
	const unsigned word = dt == DPTP_DTYPE_FP32 ? 0x80000000u : 0x80008000u;
	size_t words = bytes / 4;
	if (words) {
		size_t g = (words + 255) / 256;
		if (g > 4096)
			g = 4096;
		fill_u32_kernel<<<(unsigned)g, 256, 0, s>>>((unsigned *)dptr, words, word);
		DPTP_CU_TRY(cudaGetLastError(), err, "fill -0.0 launch");
	}
	if (bytes % 4) {
		fill_u16_kernel<<<1, 1, 0, s>>>((unsigned short *)((char *)dptr + words * 4), 0x8000);
		DPTP_CU_TRY(cudaGetLastError(), err, "fill -0.0 launch");
	}
	if (!s)
		DPTP_CU_TRY(cudaStreamSynchronize(0), err, "cudaStreamSynchronize");
	return 0;
}

static int ar_init_state(struct dptp_cuda_ar *ar, struct dptp_err *err)
{
	const struct dptp_ar_layout *l = &ar->lay;
	char *own = (char *)ar->cfg.peer_bufs[ar->cfg.rank];
	const size_t elsize = dptp_dtype_bytes(ar->cfg.dtype);
	DPTP_CU_TRY(cudaMemset(ar->ctrl, 0, sizeof(Ctrl)), err, "cudaMemset");
	for (int i = 0; i < 3; i++) {
		int rc = dptp_cuda_fill_neg_zero(own + l->lamport[i],
						 l->slot_bytes * (size_t)ar->cfg.nranks / elsize,
						 ar->cfg.dtype, NULL, err);
		if (rc)
			return rc;
	}
	DPTP_CU_TRY(cudaMemset(own + l->scatter, 0, l->total - l->scatter), err, "cudaMemset");
	DPTP_CU_TRY(cudaDeviceSynchronize(), err, "cudaDeviceSynchronize");
	return 0;
}

int dptp_cuda_ar_create(const struct dptp_cuda_ar_config *cfg, struct dptp_cuda_ar **out,
			struct dptp_err *err)
{
	*out = NULL;
	const int n = cfg->nranks;
	if (n != 1 && n != 2 && n != 4 && n != 8)
		return dptp_kerr(err, -EINVAL, "fused allreduce: ranks %d, not 1, 2, 4 or 8", n);
	if (cfg->rank < 0 || cfg->rank >= n)
		return dptp_kerr(err, -EINVAL, "fused allreduce: rank %d of %d", cfg->rank, n);
	struct dptp_cuda_ar *ar = (struct dptp_cuda_ar *)calloc(1, sizeof(*ar));
	if (!ar)
		return dptp_kerr(err, -ENOMEM, "out of host memory");
	ar->cfg = *cfg;
	int rc = 0;
	if (n > 1 && dptp_ar_layout_get(n, cfg->max_bytes, &ar->lay)) {
		rc = dptp_kerr(err, -EINVAL, "fused allreduce: bad max_bytes %zu", cfg->max_bytes);
		goto fail;
	}
	for (int i = 0; i < n && n > 1; i++) {
		if (!cfg->peer_bufs[i] || ((uintptr_t)cfg->peer_bufs[i] & 255u)) {
			rc = dptp_kerr(err, -EINVAL,
				       "fused allreduce: buffer of rank %d is NULL or not 256-byte aligned", i);
			goto fail;
		}
	}
	rc = dptp_cuda_check(cudaGetDevice(&ar->device), err, "cudaGetDevice");
	if (rc)
		goto fail;
	rc = dptp_cuda_check(cudaMalloc((void **)&ar->ctrl, sizeof(Ctrl)), err, "cudaMalloc");
	if (rc)
		goto fail;
	if (n > 1) {
		rc = ar_init_state(ar, err);
		if (rc)
			goto fail;
	} else {
		rc = dptp_cuda_check(cudaMemset(ar->ctrl, 0, sizeof(Ctrl)), err, "cudaMemset");
		if (rc)
			goto fail;
	}
	*out = ar;
	return 0;
fail:
	dptp_cuda_ar_destroy(ar);
	return rc;
}

void dptp_cuda_ar_destroy(struct dptp_cuda_ar *ar)
{
	if (!ar)
		return;
	if (ar->ctrl)
		(void)cudaFree(ar->ctrl);
	free(ar);
}

int dptp_cuda_ar_reset(struct dptp_cuda_ar *ar, struct dptp_err *err)
{
	if (ar->cfg.nranks == 1)
		return dptp_cuda_check(cudaMemset(ar->ctrl, 0, sizeof(Ctrl)), err, "cudaMemset");
	return ar_init_state(ar, err);
}

/* The TP 1 kernel: shape from vpt_min; grid one block per row, or what fits
 * (DPTP_NORM_PERSISTENT, DPTP_NORM_STAGED), capped by max_blocks; two
 * blocks per row in clusters of 2 (DPTP_NORM_PAIR). The staged kernel falls
 * back to the row kernel (same other flags) when two rows do not fit in a
 * block's shared memory, the pair when a half is not whole warps or the
 * grid is capped. flags NORM_DEFAULT: what the default runs at this shape. */
static int norm_launch(const struct dptp_ar_args *a, enum dptp_dtype dt, int vpt_min, int flags,
		       cudaStream_t s, int *grid_out, struct dptp_err *err)
{
	int rc = check_ptrs(a, err);
	if (rc)
		return rc;
	rc = dptp_ar_validate(1, a->tokens, a->hidden, dt, 0, DPTP_AR_NORM_ONLY, err);
	if (rc)
		return rc;
	struct dptp_ar_shape sh;
	if (dptp_ar_norm_shape_get(a->hidden, dt, vpt_min, &sh))
		return dptp_kerr(err, -EINVAL, "residual + RMSNorm: %d vectors per thread", vpt_min);
	if (flags == NORM_DEFAULT)
		flags = dptp_ar_norm_default_flags(&sh);
	int stages = 0;
	size_t smem = 0;
	rc = norm_smem(sh.hvec, flags, &stages, &smem, err);
	if (rc)
		return rc;
	if ((flags & DPTP_NORM_STAGED) && !stages) {
		flags &= ~(DPTP_NORM_STAGED | DPTP_NORM_BPS(15));
		smem = 0;
	}
	if ((flags & DPTP_NORM_PAIR) &&
	    (sh.threads % 64 || a->max_blocks > 0 || a->tokens > ((size_t)1 << 29) ||
	     (flags & (DPTP_NORM_PERSISTENT | DPTP_NORM_STAGED)) || smem))
		flags &= ~DPTP_NORM_PAIR;
	const int pair = (flags & DPTP_NORM_PAIR) ? 2 : 1;
	const void *fn = norm_for(dt, sh.vpt, flags);
	if (!fn)
		return dptp_kerr(err, -EINVAL, "residual + RMSNorm: no kernel for this shape");
	int resident = 0;
	if ((flags & (DPTP_NORM_PERSISTENT | DPTP_NORM_STAGED)) || smem) {
		rc = resident_cached(fn, sh.threads, smem, &resident, err);
		if (rc)
			return rc;
		if (resident < 1)
			return dptp_kerr(err, -EINVAL, "residual + RMSNorm: no block fits (%zu bytes of shared memory)", smem);
	}
	if (!(flags & (DPTP_NORM_PERSISTENT | DPTP_NORM_STAGED)))
		resident = 0; /* one block per row */
	const int grid = dptp_ar_grid(DPTP_AR_NORM_ONLY, 1, a->tokens, a->max_blocks, resident);
	Params k;
	memset(&k, 0, sizeof(k));
	fill_common(k, a, dt, sh);
	k.stages = stages;
	if (grid_out)
		*grid_out = grid * pair;
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute attr[2] = {};
	unsigned nattr = 0;
	if (flags & DPTP_NORM_PDL) {
		attr[nattr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		attr[nattr++].val.programmaticStreamSerializationAllowed = 1;
	}
	if (pair == 2) {
		attr[nattr].id = cudaLaunchAttributeClusterDimension;
		attr[nattr].val.clusterDim.x = 2;
		attr[nattr].val.clusterDim.y = 1;
		attr[nattr++].val.clusterDim.z = 1;
	}
	cfg.gridDim = dim3(grid * pair);
	cfg.blockDim = dim3(sh.threads / pair);
	cfg.dynamicSmemBytes = smem;
	cfg.stream = s;
	cfg.attrs = attr;
	cfg.numAttrs = nattr;
	void *args[] = {&k};
	DPTP_CU_TRY(cudaLaunchKernelExC(&cfg, fn, args), err, "cudaLaunchKernelExC");
	return 0;
}

int dptp_cuda_ar_resident_blocks(enum dptp_dtype dt, size_t hidden, int nranks, int *blocks,
				 struct dptp_err *err)
{
	struct dptp_ar_shape sh;
	if (nranks == 1) {
		if (dptp_ar_norm_shape_get(hidden, dt, NORM_VPT_MIN, &sh))
			return dptp_kerr(err, -EINVAL, "hidden %zu not supported", hidden);
		const int f = dptp_ar_norm_default_flags(&sh) & ~DPTP_NORM_STAGED;
		return resident_cached(norm_for(dt, sh.vpt, f), sh.threads, 0, blocks, err);
	}
	if (dptp_ar_shape_get(hidden, dt, &sh))
		return dptp_kerr(err, -EINVAL, "hidden %zu not supported", hidden);
	int best = 0;
	const enum dptp_ar_algo algos[] = {DPTP_AR_ONESHOT, DPTP_AR_TWOSHOT};
	for (int i = 0; i < 2; i++) {
		const void *fn = kernel_for(algos[i], dt, nranks, sh.vpt);
		if (!fn)
			return dptp_kerr(err, -EINVAL, "no kernel for ranks %d", nranks);
		int b = 0;
		int rc = resident_of(fn, sh.threads, 0, &b, err);
		if (rc)
			return rc;
		if (i == 0 || b < best)
			best = b;
	}
	*blocks = best;
	return 0;
}

int dptp_cuda_ar_fused(struct dptp_cuda_ar *ar, const struct dptp_ar_args *a, void *stream,
		       enum dptp_ar_algo *used, struct dptp_err *err)
{
	const int n = ar->cfg.nranks;
	const enum dptp_dtype dt = ar->cfg.dtype;
	int rc = check_ptrs(a, err);
	if (rc)
		return rc;
	if (n == 1) {
		rc = norm_launch(a, dt, NORM_VPT_MIN, NORM_DEFAULT, (cudaStream_t)stream, NULL, err);
		if (!rc && used)
			*used = DPTP_AR_NORM_ONLY;
		return rc;
	}
	enum dptp_ar_algo algo = a->algo;
	if (algo == DPTP_AR_AUTO)
		algo = dptp_ar_choose(n, a->tokens, a->hidden, dt);
	rc = dptp_ar_validate(n, a->tokens, a->hidden, dt, ar->cfg.max_bytes, algo, err);
	if (rc)
		return rc;
	struct dptp_ar_shape sh;
	dptp_ar_shape_get(a->hidden, dt, &sh);
	const void *fn = kernel_for(algo, dt, n, sh.vpt);
	if (!fn)
		return dptp_kerr(err, -EINVAL, "no kernel for this shape");

	int resident = 0;
	if (a->max_blocks <= 0) {
		if (ar->cached_hidden != a->hidden) {
			rc = dptp_cuda_ar_resident_blocks(dt, a->hidden, n, &ar->cached_resident[0], err);
			if (rc)
				return rc;
			ar->cached_hidden = a->hidden;
		}
		resident = ar->cached_resident[0];
	}
	const int grid = dptp_ar_grid(algo, n, a->tokens, a->max_blocks, resident);

	Params k;
	memset(&k, 0, sizeof(k));
	fill_common(k, a, dt, sh);
	for (int i = 0; i < n; i++)
		k.bufs[i] = (char *)ar->cfg.peer_bufs[i];
	k.ctrl = ar->ctrl;
	k.rank = ar->cfg.rank;
	k.slot_bytes = ar->lay.slot_bytes;
	for (int i = 0; i < 3; i++)
		k.lamport[i] = ar->lay.lamport[i];
	k.scatter = ar->lay.scatter;
	k.gather_res = ar->lay.gather_res;
	k.gather_norm = ar->lay.gather_norm;
	k.flags = ar->lay.flags;
	rc = launch(fn, grid, sh.threads, k, (cudaStream_t)stream, err);
	if (rc)
		return rc;
	if (used)
		*used = algo;
	return 0;
}

int dptp_cuda_ar_check(struct dptp_cuda_ar *ar, void *stream, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaStreamSynchronize((cudaStream_t)stream), err, "cudaStreamSynchronize");
	int e = 0;
	DPTP_CU_TRY(cudaMemcpy(&e, &ar->ctrl->error, sizeof(e), cudaMemcpyDeviceToHost), err,
		    "cudaMemcpy");
	if (!e)
		return 0;
	const int zero = 0;
	DPTP_CU_TRY(cudaMemcpy(&ar->ctrl->error, &zero, sizeof(zero), cudaMemcpyHostToDevice), err,
		    "cudaMemcpy");
	return dptp_kerr(err, -ETIMEDOUT, "rank %d of %d: %s%s%s timed out waiting for a peer",
			 ar->cfg.rank, ar->cfg.nranks, (e & ERR_LAMPORT) ? "one-shot read" : "",
			 (e & ERR_LAMPORT) && (e & ERR_BARRIER) ? " and " : "",
			 (e & ERR_BARRIER) ? "two-shot barrier" : "");
}

int dptp_cuda_residual_rmsnorm(const struct dptp_ar_args *a, enum dptp_dtype dt, void *stream,
			       struct dptp_err *err)
{
	return norm_launch(a, dt, NORM_VPT_MIN, NORM_DEFAULT, (cudaStream_t)stream, NULL, err);
}

int dptp_cuda_residual_rmsnorm_variant(const struct dptp_ar_args *a, enum dptp_dtype dt,
				       int vpt_min, int flags, void *stream, int *grid,
				       struct dptp_err *err)
{
	if (vpt_min != 1 && vpt_min != 2 && vpt_min != 4 && vpt_min != 8)
		return dptp_kerr(err, -EINVAL, "residual + RMSNorm: vectors per thread %d", vpt_min);
	return norm_launch(a, dt, vpt_min, flags, (cudaStream_t)stream, grid, err);
}
