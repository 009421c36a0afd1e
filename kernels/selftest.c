/* dptp-kernel-selftest: the CUDA side of dptp on one GPU, in one process.
 *
 * Simulates TP 1, 2, 4, 8 with one cuMem IPC buffer per rank (each peer's
 * buffer reached through an fd exported and imported again, as another
 * process would), launches every rank's fused kernel on its own stream at
 * once, and checks every rank's outputs against a CPU reference made from
 * exactly representable inputs: residual_out must be exact, norm_out within
 * one unit in the last place of its dtype (fp32: 16), all ranks and both
 * algorithms bit-identical, and equal to the unfused residual + RMSNorm
 * kernel. Then checks that a missing peer times out instead of hanging,
 * that chained residual + RMSNorm calls launched back to back (PDL) give
 * the bits of the same calls synchronised, and times fused one-shot /
 * two-shot against the separate residual + RMSNorm kernel.
 *
 * Usage: dptp-kernel-selftest [--no-bench] [--quick] [--norm-bench]
 * (--norm-bench: the quick correctness sweep, then only the TP 1 residual +
 * RMSNorm kernel's variants against the copy bandwidth.)
 * JSON on stdout, progress and a table on stderr. Exit 0 pass, 1 fail,
 * 77 no GPU (meson's skip). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "plan.h"

#define CHECK(call)                                                                   \
	do {                                                                          \
		int rc_ = (call);                                                     \
		if (rc_ < 0) {                                                        \
			fprintf(stderr, "selftest: %s:%d: %s: %s (%d)\n", __FILE__,  \
				__LINE__, #call, errbuf.msg, rc_);                    \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static struct dptp_err errbuf;

/* ---- host fp16/bf16 ---- */

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t to_bf16(float f)
{
	uint32_t u = f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return 0x7fc0;
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

static float from_f16(uint16_t h)
{
	uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0)
		return (s ? -1.f : 1.f) * ldexpf((float)m, -24);
	if (e == 31)
		return u2f(s | 0x7f800000u | (m << 13));
	return u2f(s | ((e + 112) << 23) | (m << 13));
}

static uint16_t to_f16(float f)
{
	/* Inputs here are exact in fp16; plain truncation of a normal suffices,
	 * but round to nearest even anyway for the general case. */
	uint32_t u = f2u(f), s = (u >> 16) & 0x8000u;
	float a = fabsf(f);
	if (a == 0.f)
		return (uint16_t)s;
	if (a < ldexpf(1.f, -14)) {
		float m = nearbyintf(a * ldexpf(1.f, 24));
		return (uint16_t)(s | (uint32_t)m);
	}
	int ex;
	float fr = frexpf(a, &ex); /* a = fr * 2^ex, fr in [0.5,1) */
	float m = nearbyintf(fr * 2048.f);
	if (m >= 2048.f) {
		m /= 2.f;
		ex++;
	}
	uint32_t e = (uint32_t)(ex - 1 + 15);
	if (e >= 31)
		return (uint16_t)(s | 0x7c00u);
	return (uint16_t)(s | (e << 10) | ((uint32_t)m & 0x3ffu));
}

static size_t esize(enum dptp_dtype dt)
{
	return dptp_dtype_bytes(dt);
}

static void put(void *buf, size_t i, float v, enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: ((float *)buf)[i] = v; break;
	case DPTP_DTYPE_FP16: ((uint16_t *)buf)[i] = to_f16(v); break;
	case DPTP_DTYPE_BF16: ((uint16_t *)buf)[i] = to_bf16(v); break;
	}
}

static float get(const void *buf, size_t i, enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: return ((const float *)buf)[i];
	case DPTP_DTYPE_FP16: return from_f16(((const uint16_t *)buf)[i]);
	case DPTP_DTYPE_BF16: return from_bf16(((const uint16_t *)buf)[i]);
	}
	return 0.f;
}

/* One unit in the last place of dt at v. */
static double ulp(double v, enum dptp_dtype dt)
{
	int mant = dt == DPTP_DTYPE_FP32 ? 23 : dt == DPTP_DTYPE_FP16 ? 10 : 7;
	int emin = dt == DPTP_DTYPE_FP32 ? -126 : dt == DPTP_DTYPE_FP16 ? -14 : -126;
	int e;
	if (v == 0)
		e = emin;
	else {
		frexp(fabs(v), &e);
		e -= 1;
		if (e < emin)
			e = emin;
	}
	return ldexp(1.0, e - mant);
}

static const char *dtname(enum dptp_dtype dt)
{
	return dt == DPTP_DTYPE_FP32 ? "fp32" : dt == DPTP_DTYPE_FP16 ? "fp16" : "bf16";
}

/* ---- deterministic, exactly representable inputs ---- */

static uint32_t hash3(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca77u ^ c * 0xc2b2ae3du;
	h ^= h >> 15;
	h *= 0x2c1b3c6du;
	h ^= h >> 12;
	return h;
}

/* x: multiples of 1/8 in [-1, 1], sometimes -0.0 (the Lamport sentinel). */
static float in_x(int r, size_t i)
{
	uint32_t h = hash3((uint32_t)r + 1, (uint32_t)i, 11);
	int v = (int)(h % 17) - 8;
	if (v == 0 && (h & 0x100))
		return -0.0f;
	return (float)v / 8.f;
}

static float in_res(size_t i)
{
	return (float)((int)(hash3(0, (uint32_t)i, 23) % 33) - 16) / 8.f;
}

static float in_gamma(size_t h)
{
	return (float)((int)(hash3(0, (uint32_t)h, 37) % 9) + 4) / 8.f;
}

struct tally {
	int cases, failures;
	double norm_max_abs, norm_max_ulp, res_max_abs;
};

static struct tally tallies[3][4][3]; /* dtype, log2 tp, algo (oneshot, twoshot, auto/norm) */
static int total_failures;
static char failures_json[16384];

static void note_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_failure(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "FAIL %s\n", line);
	size_t len = strlen(failures_json);
	if (len + strlen(line) + 8 < sizeof(failures_json))
		snprintf(failures_json + len, sizeof(failures_json) - len, "%s\"%s\"",
			 len ? ", " : "", line);
	total_failures++;
}

/* ---- per-rank state ---- */

struct rank {
	struct dptp_cuda_mem *mem;	/* own IPC buffer */
	struct dptp_cuda_mem *imported;	/* the same buffer again, through an fd */
	struct dptp_cuda_ar *ar;
	void *stream;
	void *x, *res, *ro, *no;	/* device, max_bytes each */
	void *done;			/* event */
};

struct world {
	int n;
	enum dptp_dtype dt;
	size_t max_bytes;
	int max_blocks;
	struct rank r[DPTP_AR_MAX_RANKS];
	void *gamma;
	void *start;
};

static void world_create(struct world *w, int n, enum dptp_dtype dt, size_t max_bytes, size_t max_hidden)
{
	memset(w, 0, sizeof(*w));
	w->n = n;
	w->dt = dt;
	w->max_bytes = max_bytes;
	int dev = 0;
	CHECK(dptp_cuda_get_device(&dev, &errbuf));
	size_t bytes = dptp_cuda_ar_buffer_bytes(n, max_bytes);
	struct dptp_cuda_ar_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.nranks = n;
	cfg.dtype = dt;
	cfg.max_bytes = max_bytes;
	for (int i = 0; i < n && n > 1; i++) {
		CHECK(dptp_cuda_mem_create(dev, bytes, &w->r[i].mem, &errbuf));
		int fd = -1;
		CHECK(dptp_cuda_mem_export(w->r[i].mem, &fd, &errbuf));
		if (dptp_cuda_mem_import(dev, fd, dptp_cuda_mem_size(w->r[i].mem), &w->r[i].imported,
					 &errbuf) < 0) {
			/* Reported; the kernels are still tested through the first mapping. */
			note_failure("ipc import of rank %d: %s", i, errbuf.msg);
			w->r[i].imported = NULL;
		}
		close(fd);
	}
	for (int i = 0; i < n; i++) {
		struct rank *r = &w->r[i];
		for (int p = 0; p < n && n > 1; p++)
			cfg.peer_bufs[p] = p == i || !w->r[p].imported
						   ? dptp_cuda_mem_ptr(w->r[p].mem)
						   : dptp_cuda_mem_ptr(w->r[p].imported);
		cfg.rank = i;
		CHECK(dptp_cuda_ar_create(&cfg, &r->ar, &errbuf));
		CHECK(dptp_cuda_stream_create(&r->stream, &errbuf));
		CHECK(dptp_cuda_event_create(&r->done, &errbuf));
		CHECK(dptp_cuda_malloc(&r->x, max_bytes, &errbuf));
		CHECK(dptp_cuda_malloc(&r->res, max_bytes, &errbuf));
		CHECK(dptp_cuda_malloc(&r->ro, max_bytes, &errbuf));
		CHECK(dptp_cuda_malloc(&r->no, max_bytes, &errbuf));
	}
	CHECK(dptp_cuda_malloc(&w->gamma, max_hidden * 4, &errbuf));
	CHECK(dptp_cuda_event_create(&w->start, &errbuf));
}

static void world_destroy(struct world *w)
{
	for (int i = 0; i < w->n; i++) {
		struct rank *r = &w->r[i];
		dptp_cuda_ar_destroy(r->ar);
		dptp_cuda_stream_destroy(r->stream);
		dptp_cuda_event_destroy(r->done);
		dptp_cuda_free(r->x);
		dptp_cuda_free(r->res);
		dptp_cuda_free(r->ro);
		dptp_cuda_free(r->no);
	}
	for (int i = 0; i < w->n; i++) {
		dptp_cuda_mem_destroy(w->r[i].imported);
		dptp_cuda_mem_destroy(w->r[i].mem);
	}
	dptp_cuda_free(w->gamma);
	dptp_cuda_event_destroy(w->start);
	memset(w, 0, sizeof(*w));
}

static int blocks_for(struct world *w, size_t hidden)
{
	int res = 0;
	CHECK(dptp_cuda_ar_resident_blocks(w->dt, hidden, w->n, &res, &errbuf));
	int b = res / w->n;
	return b < 1 ? 1 : b;
}

/* Every rank's fused call, concurrently: s0 records start, the others wait
 * on it, each launches, s0 waits for all. Returns 0 or the launch error. */
static int run_all(struct world *w, size_t tokens, size_t hidden, enum dptp_ar_algo algo,
		   uint64_t timeout_ns, int only_ranks, enum dptp_ar_algo *used)
{
	void *s0 = w->r[0].stream;
	CHECK(dptp_cuda_event_record(w->start, s0, &errbuf));
	int n = only_ranks > 0 ? only_ranks : w->n;
	for (int i = 1; i < n; i++)
		CHECK(dptp_cuda_stream_wait_event(w->r[i].stream, w->start, &errbuf));
	for (int i = 0; i < n; i++) {
		struct rank *r = &w->r[i];
		struct dptp_ar_args a = {
			.x = r->x, .residual_in = r->res, .gamma = w->gamma,
			.residual_out = r->ro, .norm_out = r->no,
			.tokens = tokens, .hidden = hidden, .eps = 1e-6f, .algo = algo,
			.max_blocks = w->max_blocks, .timeout_ns = timeout_ns,
		};
		int rc = dptp_cuda_ar_fused(r->ar, &a, r->stream, used, &errbuf);
		if (rc)
			return rc;
		CHECK(dptp_cuda_event_record(r->done, r->stream, &errbuf));
	}
	for (int i = 1; i < n; i++)
		CHECK(dptp_cuda_stream_wait_event(s0, w->r[i].done, &errbuf));
	return 0;
}

/* ---- correctness ---- */

static int log2i(int n)
{
	return n == 1 ? 0 : n == 2 ? 1 : n == 4 ? 2 : 3;
}

/* Inputs for one case, uploaded; reference computed. */
struct refcase {
	size_t tokens, hidden, count;
	float *sum;		/* exact allreduce of x (fp32, exact) */
	float *ro;		/* exact residual_out */
	double *norm;		/* exact-ish norm_out */
	void *host;		/* staging, max_bytes */
	void *host2;
	void *unfused_ro;	/* host copies of the unfused kernel's outputs */
	void *unfused_no;
	int unfused_bad;	/* the unfused outputs are wrong (reported once) */
	double res_abs, norm_abs, norm_ulp;
};

static void make_case(struct world *w, struct refcase *c, size_t tokens, size_t hidden)
{
	enum dptp_dtype dt = w->dt;
	size_t count = tokens * hidden;
	c->tokens = tokens;
	c->hidden = hidden;
	c->count = count;
	for (size_t i = 0; i < count; i++)
		c->sum[i] = 0.f;
	for (int r = 0; r < w->n; r++) {
		for (size_t i = 0; i < count; i++) {
			float v = in_x(r, i);
			put(c->host, i, v, dt);
			c->sum[i] += v == 0.f ? 0.f : v;
		}
		CHECK(dptp_cuda_memcpy(w->r[r].x, c->host, count * esize(dt), NULL, &errbuf));
	}
	for (size_t i = 0; i < count; i++) {
		put(c->host, i, in_res(i), dt);
		c->ro[i] = c->sum[i] + in_res(i); /* exact: multiples of 1/8 below 16 */
	}
	for (int r = 0; r < w->n; r++)
		CHECK(dptp_cuda_memcpy(w->r[r].res, c->host, count * esize(dt), NULL, &errbuf));
	for (size_t h = 0; h < hidden; h++)
		put(c->host, h, in_gamma(h), dt);
	CHECK(dptp_cuda_memcpy(w->gamma, c->host, hidden * esize(dt), NULL, &errbuf));
	for (size_t t = 0; t < tokens; t++) {
		double ss = 0;
		for (size_t h = 0; h < hidden; h++)
			ss += (double)c->ro[t * hidden + h] * c->ro[t * hidden + h];
		double rstd = 1.0 / sqrt(ss / (double)hidden + 1e-6);
		for (size_t h = 0; h < hidden; h++)
			c->norm[t * hidden + h] = c->ro[t * hidden + h] * rstd * in_gamma(h);
	}
	/* The unfused kernel on the exact sum: the fused outputs must equal it bit for bit. */
	struct rank *r0 = &w->r[0];
	for (size_t i = 0; i < count; i++)
		put(c->host, i, c->sum[i], dt);
	CHECK(dptp_cuda_memcpy(r0->x, c->host, count * esize(dt), NULL, &errbuf));
	struct dptp_ar_args a = {
		.x = r0->x, .residual_in = r0->res, .gamma = w->gamma, .residual_out = r0->ro,
		.norm_out = r0->no, .tokens = tokens, .hidden = hidden, .eps = 1e-6f,
	};
	CHECK(dptp_cuda_residual_rmsnorm(&a, dt, NULL, &errbuf));
	CHECK(dptp_cuda_device_sync(&errbuf));
	CHECK(dptp_cuda_memcpy(c->unfused_ro, r0->ro, count * esize(dt), NULL, &errbuf));
	CHECK(dptp_cuda_memcpy(c->unfused_no, r0->no, count * esize(dt), NULL, &errbuf));
	/* Its residual_out exact, its norm_out within tolerance of the reference. */
	c->res_abs = c->norm_abs = c->norm_ulp = 0;
	c->unfused_bad = 0;
	size_t first_bad = (size_t)-1;
	for (size_t i = 0; i < count; i++) {
		double d = fabs((double)get(c->unfused_ro, i, dt) - c->ro[i]);
		if (!(d == 0)) {
			if (first_bad == (size_t)-1)
				first_bad = i;
			c->res_abs = isnan(d) ? INFINITY : fmax(c->res_abs, d);
		}
		double e = fabs((double)get(c->unfused_no, i, dt) - c->norm[i]);
		if (isnan(e))
			e = INFINITY;
		c->norm_abs = fmax(c->norm_abs, e);
		c->norm_ulp = fmax(c->norm_ulp, e / ulp(c->norm[i], dt));
	}
	if (first_bad != (size_t)-1) {
		note_failure("%s %zux%zu unfused residual_out[%zu] = %g, want %g", dtname(dt), tokens,
			     hidden, first_bad, (double)get(c->unfused_ro, first_bad, dt),
			     (double)c->ro[first_bad]);
		c->unfused_bad = 1;
	}
	double tol = dt == DPTP_DTYPE_FP32 ? 16 : 1;
	if (c->norm_ulp > tol) {
		note_failure("%s %zux%zu: norm_out off by %.2f ulp (max abs %.3g)", dtname(dt), tokens,
			     hidden, c->norm_ulp, c->norm_abs);
		c->unfused_bad = 1;
	}
	/* Restore rank 0's own x. */
	for (size_t i = 0; i < count; i++)
		put(c->host, i, in_x(0, i), dt);
	CHECK(dptp_cuda_memcpy(r0->x, c->host, count * esize(dt), NULL, &errbuf));
}

static void check_case(struct world *w, struct refcase *c, enum dptp_ar_algo algo, int slot)
{
	enum dptp_dtype dt = w->dt;
	size_t count = c->count, bytes = count * esize(dt);
	enum dptp_ar_algo used = algo;
	/* Poison the outputs so that an unwritten element shows. */
	for (int r = 0; r < w->n; r++) {
		CHECK(dptp_cuda_memset(w->r[r].ro, 0x7f, bytes, NULL, &errbuf));
		CHECK(dptp_cuda_memset(w->r[r].no, 0x7f, bytes, NULL, &errbuf));
	}
	CHECK(run_all(w, c->tokens, c->hidden, algo, 2000000000ull, 0, &used));
	int bad = 0;
	for (int r = 0; r < w->n; r++) {
		int rc = dptp_cuda_ar_check(w->r[r].ar, w->r[r].stream, &errbuf);
		if (rc) {
			note_failure("%s tp%d %s %zux%zu rank %d: %s", dtname(dt), w->n,
				     dptp_ar_algo_name(used), c->tokens, c->hidden, r, errbuf.msg);
			CHECK(dptp_cuda_ar_reset(w->r[r].ar, &errbuf));
			bad = 1;
		}
	}
	CHECK(dptp_cuda_device_sync(&errbuf));
	struct tally *t = &tallies[dt][log2i(w->n)][slot];
	t->cases++;
	/* Every rank bit for bit equal to the unfused kernel, which was checked
	 * against the reference in make_case. */
	for (int r = 0; r < w->n && !bad; r++) {
		CHECK(dptp_cuda_memcpy(c->host, w->r[r].ro, bytes, NULL, &errbuf));
		CHECK(dptp_cuda_memcpy(c->host2, w->r[r].no, bytes, NULL, &errbuf));
		const void *got[2] = {c->host, c->host2}, *want[2] = {c->unfused_ro, c->unfused_no};
		const char *what[2] = {"residual_out", "norm_out"};
		for (int o = 0; o < 2 && !bad; o++) {
			if (memcmp(got[o], want[o], bytes) == 0)
				continue;
			size_t i = 0;
			while (i < count && !memcmp((const char *)got[o] + i * esize(dt),
						    (const char *)want[o] + i * esize(dt), esize(dt)))
				i++;
			size_t hid = c->hidden;
			note_failure("%s tp%d %s %zux%zu rank %d: %s[%zu][%zu] = %g, unfused kernel %g",
				     dtname(dt), w->n, dptp_ar_algo_name(used), c->tokens, hid, r,
				     what[o], i / hid, i % hid, (double)get(got[o], i, dt),
				     (double)get(want[o], i, dt));
			bad = 1;
		}
	}
	if (bad || c->unfused_bad)
		t->failures++;
	t->res_max_abs = fmax(t->res_max_abs, c->res_abs);
	t->norm_max_abs = fmax(t->norm_max_abs, c->norm_abs);
	t->norm_max_ulp = fmax(t->norm_max_ulp, c->norm_ulp);
}

static const size_t sweep_tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
static const size_t sweep_hidden[] = {4096, 8192};

static void test_correctness(bool quick)
{
	const enum dptp_dtype dts[] = {DPTP_DTYPE_BF16, DPTP_DTYPE_FP16, DPTP_DTYPE_FP32};
	const int tps[] = {1, 2, 4, 8};
	/* The sweep, then shapes off the grid and shrinking sizes (Lamport clears). */
	struct { size_t t, h; } extra[] = {{3, 1024}, {1000, 8}, {7, 16384}, {33, 2048}, {1, 8192},
					   {129, 4096}, {2, 32768}, {5, 8}};
	size_t max_t = quick ? 256 : 2048, max_count = max_t * 8192;
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		if (extra[i].t * extra[i].h > max_count)
			max_count = extra[i].t * extra[i].h;
	struct refcase c;
	c.sum = malloc(max_count * sizeof(float));
	c.ro = malloc(max_count * sizeof(float));
	c.norm = malloc(max_count * sizeof(double));
	c.host = malloc(max_count * 4);
	c.host2 = malloc(max_count * 4);
	c.unfused_ro = malloc(max_count * 4);
	c.unfused_no = malloc(max_count * 4);
	if (!c.sum || !c.ro || !c.norm || !c.host || !c.host2 || !c.unfused_ro || !c.unfused_no) {
		fprintf(stderr, "selftest: out of host memory\n");
		exit(1);
	}
	for (size_t d = 0; d < 3; d++) {
		for (size_t ti = 0; ti < 4; ti++) {
			struct world w;
			enum dptp_dtype dt = dts[d];
			int n = tps[ti];
			world_create(&w, n, dt, max_count * esize(dt), 32768);
			double t0 = (double)clock() / CLOCKS_PER_SEC;
			size_t nsweep = sizeof(sweep_tokens) / sizeof(sweep_tokens[0]);
			size_t ncase = nsweep * 2 + sizeof(extra) / sizeof(extra[0]);
			for (size_t k = 0; k < ncase; k++) {
				size_t t, h;
				if (k < nsweep * 2) {
					t = sweep_tokens[k / 2];
					h = sweep_hidden[k % 2];
				} else {
					t = extra[k - nsweep * 2].t;
					h = extra[k - nsweep * 2].h;
				}
				if (t > max_t || h > dptp_cuda_ar_max_hidden(dt))
					continue;
				if (total_failures >= 12) {
					fprintf(stderr, "too many failures: correctness stops here\n");
					world_destroy(&w);
					goto out;
				}
				w.max_blocks = blocks_for(&w, h);
				make_case(&w, &c, t, h);
				if (n == 1) {
					check_case(&w, &c, DPTP_AR_AUTO, 2);
					continue;
				}
				check_case(&w, &c, DPTP_AR_ONESHOT, 0);
				if (t >= (size_t)n)
					check_case(&w, &c, DPTP_AR_TWOSHOT, 1);
				check_case(&w, &c, DPTP_AR_AUTO, 2);
			}
			fprintf(stderr, "correctness %s tp%d: done (%.1f s cpu)\n", dtname(dt), n,
				(double)clock() / CLOCKS_PER_SEC - t0);
			world_destroy(&w);
		}
	}
out:
	free(c.sum);
	free(c.ro);
	free(c.norm);
	free(c.host);
	free(c.host2);
	free(c.unfused_ro);
	free(c.unfused_no);
}

/* ---- IPC path and timeouts ---- */

static bool test_ipc(void)
{
	int dev = 0;
	CHECK(dptp_cuda_get_device(&dev, &errbuf));
	size_t gran = 0;
	CHECK(dptp_cuda_mem_granularity(dev, &gran, &errbuf));
	struct dptp_cuda_mem *a = NULL, *b = NULL;
	CHECK(dptp_cuda_mem_create(dev, 3 * gran + 1, &a, &errbuf));
	int fd = -1;
	CHECK(dptp_cuda_mem_export(a, &fd, &errbuf));
	if (dptp_cuda_mem_import(dev, fd, dptp_cuda_mem_size(a), &b, &errbuf) < 0) {
		close(fd);
		note_failure("ipc import: %s", errbuf.msg);
		dptp_cuda_mem_destroy(a);
		return false;
	}
	close(fd);
	size_t n = dptp_cuda_mem_size(a) / 4;
	uint32_t *h = malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		h[i] = (uint32_t)i * 2654435761u;
	CHECK(dptp_cuda_memcpy(dptp_cuda_mem_ptr(a), h, n * 4, NULL, &errbuf));
	uint32_t *back = malloc(n * 4);
	CHECK(dptp_cuda_memcpy(back, dptp_cuda_mem_ptr(b), n * 4, NULL, &errbuf));
	bool ok = dptp_cuda_mem_size(a) == 4 * gran && dptp_cuda_mem_ptr(a) != dptp_cuda_mem_ptr(b) &&
		  memcmp(h, back, n * 4) == 0;
	/* And the -0.0 fill, through the imported mapping. */
	CHECK(dptp_cuda_fill_neg_zero(dptp_cuda_mem_ptr(b), 5, DPTP_DTYPE_BF16, NULL, &errbuf));
	CHECK(dptp_cuda_memcpy(back, dptp_cuda_mem_ptr(a), 16, NULL, &errbuf));
	ok = ok && back[0] == 0x80008000u && back[1] == 0x80008000u &&
	     (back[2] & 0xffffu) == 0x8000u && (back[2] >> 16) == (h[2] >> 16) && back[3] == h[3];
	free(h);
	free(back);
	dptp_cuda_mem_destroy(b);
	dptp_cuda_mem_destroy(a);
	fprintf(stderr, "ipc export/import: %s (granularity %zu)\n", ok ? "pass" : "FAIL", gran);
	if (!ok)
		note_failure("ipc: data written through one mapping not read through the other");
	return ok;
}

/* A missing peer must give -ETIMEDOUT promptly, not a hung GPU. */
static void test_timeout(double *oneshot_s, double *twoshot_s)
{
	struct world w;
	world_create(&w, 2, DPTP_DTYPE_BF16, 64 * 4096 * 2, 4096);
	w.max_blocks = blocks_for(&w, 4096);
	const enum dptp_ar_algo algos[] = {DPTP_AR_ONESHOT, DPTP_AR_TWOSHOT};
	for (int i = 0; i < 2; i++) {
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		CHECK(run_all(&w, 64, 4096, algos[i], 50000000ull, 1, NULL)); /* rank 0 alone, 50 ms */
		int rc = dptp_cuda_ar_check(w.r[0].ar, w.r[0].stream, &errbuf);
		clock_gettime(CLOCK_MONOTONIC, &b);
		double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
		*(i ? twoshot_s : oneshot_s) = s;
		fprintf(stderr, "timeout %s: rc %d (%s) after %.3f s\n", dptp_ar_algo_name(algos[i]), rc,
			rc ? errbuf.msg : "none", s);
		if (rc != -ETIMEDOUT || s > 2.0)
			note_failure("timeout %s: rc %d after %.3f s, want -ETIMEDOUT within 2 s",
				     dptp_ar_algo_name(algos[i]), rc, s);
		CHECK(dptp_cuda_ar_reset(w.r[0].ar, &errbuf));
		CHECK(dptp_cuda_ar_reset(w.r[1].ar, &errbuf));
	}
	world_destroy(&w);
}

/* ---- bench ---- */

static int cmpf(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

#define WARMUP 5
#define ITERS 30

static float median(float *v, int n)
{
	qsort(v, (size_t)n, sizeof(float), cmpf);
	return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static float time_fused(struct world *w, size_t t, size_t h, enum dptp_ar_algo algo)
{
	float ms[ITERS];
	void *end = NULL;
	CHECK(dptp_cuda_event_create(&end, &errbuf));
	for (int it = 0; it < WARMUP + ITERS; it++) {
		CHECK(run_all(w, t, h, algo, 1000000000ull, 0, NULL));
		CHECK(dptp_cuda_event_record(end, w->r[0].stream, &errbuf));
		CHECK(dptp_cuda_event_sync(end, &errbuf));
		if (it >= WARMUP)
			CHECK(dptp_cuda_event_elapsed_ms(w->start, end, &ms[it - WARMUP], &errbuf));
	}
	for (int r = 0; r < w->n; r++)
		if (dptp_cuda_ar_check(w->r[r].ar, w->r[r].stream, &errbuf))
			note_failure("bench tp%d %s %zux%zu: %s", w->n, dptp_ar_algo_name(algo), t, h,
				     errbuf.msg);
	dptp_cuda_event_destroy(end);
	return median(ms, ITERS) * 1000.f;
}

static float time_norm(struct world *w, size_t t, size_t h)
{
	float ms[ITERS];
	void *end = NULL;
	struct rank *r = &w->r[0];
	CHECK(dptp_cuda_event_create(&end, &errbuf));
	struct dptp_ar_args a = {
		.x = r->x, .residual_in = r->res, .gamma = w->gamma, .residual_out = r->ro,
		.norm_out = r->no, .tokens = t, .hidden = h, .eps = 1e-6f,
		.max_blocks = w->max_blocks,
	};
	for (int it = 0; it < WARMUP + ITERS; it++) {
		CHECK(dptp_cuda_event_record(w->start, r->stream, &errbuf));
		CHECK(dptp_cuda_residual_rmsnorm(&a, w->dt, r->stream, &errbuf));
		CHECK(dptp_cuda_event_record(end, r->stream, &errbuf));
		CHECK(dptp_cuda_event_sync(end, &errbuf));
		if (it >= WARMUP)
			CHECK(dptp_cuda_event_elapsed_ms(w->start, end, &ms[it - WARMUP], &errbuf));
	}
	dptp_cuda_event_destroy(end);
	return median(ms, ITERS) * 1000.f;
}

static void fill_inputs(struct world *w, size_t count)
{
	uint16_t *h = malloc(count * 2);
	for (int r = 0; r < w->n; r++) {
		for (size_t i = 0; i < count; i++)
			h[i] = to_bf16(in_x(r, i));
		CHECK(dptp_cuda_memcpy(w->r[r].x, h, count * 2, NULL, &errbuf));
		for (size_t i = 0; i < count; i++)
			h[i] = to_bf16(in_res(i));
		CHECK(dptp_cuda_memcpy(w->r[r].res, h, count * 2, NULL, &errbuf));
	}
	for (size_t i = 0; i < 32768; i++)
		h[i] = to_bf16(in_gamma(i));
	CHECK(dptp_cuda_memcpy(w->gamma, h, 32768 * 2, NULL, &errbuf));
	free(h);
}

/* Device-to-device copy of 1 GiB (cudaMemcpy), bytes read + written per
 * second: the ceiling of a memory-bound kernel. */
static double copy_bandwidth(void)
{
	void *a = NULL, *b = NULL, *s = NULL, *e0 = NULL, *e1 = NULL;
	const size_t cb = (size_t)1 << 30;
	CHECK(dptp_cuda_malloc(&a, cb, &errbuf));
	CHECK(dptp_cuda_malloc(&b, cb, &errbuf));
	CHECK(dptp_cuda_memset(a, 1, cb, NULL, &errbuf));
	CHECK(dptp_cuda_stream_create(&s, &errbuf));
	CHECK(dptp_cuda_event_create(&e0, &errbuf));
	CHECK(dptp_cuda_event_create(&e1, &errbuf));
	float ms[ITERS];
	for (int it = 0; it < WARMUP + ITERS; it++) {
		CHECK(dptp_cuda_event_record(e0, s, &errbuf));
		CHECK(dptp_cuda_memcpy(b, a, cb, s, &errbuf));
		CHECK(dptp_cuda_event_record(e1, s, &errbuf));
		CHECK(dptp_cuda_event_sync(e1, &errbuf));
		if (it >= WARMUP)
			CHECK(dptp_cuda_event_elapsed_ms(e0, e1, &ms[it - WARMUP], &errbuf));
	}
	dptp_cuda_free(a);
	dptp_cuda_free(b);
	dptp_cuda_stream_destroy(s);
	dptp_cuda_event_destroy(e0);
	dptp_cuda_event_destroy(e1);
	return 2.0 * (double)cb / (median(ms, ITERS) * 1e-3) / 1e9;
}

/* ---- the TP 1 residual + RMSNorm kernel against the copy ceiling ---- */

/* Microseconds per cudaMemcpy of bytes, B2B_CALLS back to back, median of
 * B2B_REPS: a copy moving what one residual + RMSNorm call moves. */
static double copy_b2b_us(size_t bytes, void *stream, void *e0, void *e1);

#define B2B_CALLS 20	/* launches per back-to-back sample */
#define B2B_REPS 10

struct norm_variant {
	int vpt_min, flags;	/* DPTP_NORM_* */
};

/* The default first (dptp_cuda_residual_rmsnorm itself). */
static const struct norm_variant norm_variants[] = {
	{DPTP_NORM_VPT_MIN, DPTP_NORM_FLAGS},
	{2, 0},
	{2, DPTP_NORM_HINTS},
	{2, DPTP_NORM_PDL},
	{2, DPTP_NORM_HINTS | DPTP_NORM_PDL},
	{2, DPTP_NORM_PDL | DPTP_NORM_BPS(3)},
	{2, DPTP_NORM_PDL | DPTP_NORM_BPS(2)},
	{4, 0},
	{4, DPTP_NORM_PDL},
	{4, DPTP_NORM_PDL | DPTP_NORM_BPS(4)},
	{4, DPTP_NORM_PDL | DPTP_NORM_BPS(5)},
	{8, DPTP_NORM_PDL},
	{2, DPTP_NORM_PDL | DPTP_NORM_L2PF},
	{2, DPTP_NORM_PDL | DPTP_NORM_L2PF_LINES},
	{2, DPTP_NORM_PDL | DPTP_NORM_L2PF_LATE},
	{2, DPTP_NORM_PDL | DPTP_NORM_L2PF | DPTP_NORM_L2PF_LATE},
	{4, DPTP_NORM_PDL | DPTP_NORM_L2PF},
	{4, DPTP_NORM_PDL | DPTP_NORM_L2PF_LINES},
	{2, DPTP_NORM_PAIR | DPTP_NORM_PDL},
	{2, DPTP_NORM_PAIR | DPTP_NORM_PDL | DPTP_NORM_L2PF},
	{2, DPTP_NORM_PREFETCH | DPTP_NORM_PERSISTENT},
	{2, DPTP_NORM_STAGED | DPTP_NORM_BPS(1) | DPTP_NORM_PDL},
	{2, DPTP_NORM_STAGED | DPTP_NORM_BPS(2) | DPTP_NORM_PDL},
};

struct norm_set {
	void *x, *res, *ro, *no;
};

static int launch_variant(const struct norm_variant *v, bool dflt, const struct norm_set *b,
			  void *gamma, size_t t, size_t h, void *stream, int *grid)
{
	struct dptp_ar_args a = {
		.x = b->x, .residual_in = b->res, .gamma = gamma, .residual_out = b->ro,
		.norm_out = b->no, .tokens = t, .hidden = h, .eps = 1e-6f,
	};
	if (dflt)
		return dptp_cuda_residual_rmsnorm(&a, DPTP_DTYPE_BF16, stream, &errbuf);
	return dptp_cuda_residual_rmsnorm_variant(&a, DPTP_DTYPE_BF16, v->vpt_min, v->flags, stream,
						  grid, &errbuf);
}

/* Chained calls, as a model's layers make them: call k's x and residual_in
 * are call k-1's norm_out and residual_out, from row T - T/4 on, so that
 * call k's first blocks read the rows call k-1 writes last (the rows past T
 * hold fixed inputs). Launched back to back, call k's blocks start, and
 * prefetch into L2 (DPTP_NORM_L2PF), while call k-1 still writes those
 * rows; the last call's outputs must equal, bit for bit, those of the same
 * chain with the stream synchronised after every call. For the default and
 * every variant that does something before the PDL wait. Returns the
 * variants checked. */
#define CHAIN_CALLS 8
static int test_chain(void)
{
	const size_t t = 2048, h = 8192, rows = 2 * t, off = (t - t / 4) * h;
	const size_t bytes = rows * h * 2, out_bytes = t * h * 2;
	void *stream = NULL, *gamma = NULL, *in[2] = {NULL, NULL}, *buf[2][2];
	uint16_t *host = malloc(bytes), *want = malloc(2 * out_bytes), *got = malloc(2 * out_bytes);
	if (!host || !want || !got) {
		fprintf(stderr, "selftest: out of host memory\n");
		exit(1);
	}
	CHECK(dptp_cuda_stream_create(&stream, &errbuf));
	CHECK(dptp_cuda_malloc(&gamma, h * 2, &errbuf));
	for (size_t i = 0; i < h; i++)
		host[i] = to_bf16(in_gamma(i));
	CHECK(dptp_cuda_memcpy(gamma, host, h * 2, NULL, &errbuf));
	/* in[0], buf[.][1]: x-like (norm_out); in[1], buf[.][0]: residual-like */
	for (int k = 0; k < 2; k++) {
		for (size_t i = 0; i < rows * h; i++)
			host[i] = to_bf16(k ? in_res(i) : in_x(0, i));
		CHECK(dptp_cuda_malloc(&in[k], bytes, &errbuf));
		CHECK(dptp_cuda_memcpy(in[k], host, bytes, NULL, &errbuf));
		for (int b = 0; b < 2; b++) {
			CHECK(dptp_cuda_malloc(&buf[b][!k], bytes, &errbuf));
			CHECK(dptp_cuda_memcpy(buf[b][!k], host, bytes, NULL, &errbuf));
		}
	}
	const size_t nvar = sizeof(norm_variants) / sizeof(norm_variants[0]);
	int checked = 0;
	for (size_t vi = 0; vi < nvar; vi++) {
		const struct norm_variant *v = &norm_variants[vi];
		if (vi && !(v->flags & (DPTP_NORM_L2PF | DPTP_NORM_L2PF_LINES | DPTP_NORM_L2PF_LATE |
					DPTP_NORM_PAIR)))
			continue;
		for (int sync = 1; sync >= 0; sync--) {
			for (int k = 0; k < CHAIN_CALLS; k++) {
				void **prev = buf[(k + 1) % 2], **cur = buf[k % 2];
				const struct norm_set b = {
					.x = k ? (char *)prev[1] + off * 2 : in[0],
					.res = k ? (char *)prev[0] + off * 2 : in[1],
					.ro = cur[0], .no = cur[1],
				};
				CHECK(launch_variant(v, vi == 0, &b, gamma, t, h, stream, NULL));
				if (sync)
					CHECK(dptp_cuda_stream_sync(stream, &errbuf));
			}
			CHECK(dptp_cuda_stream_sync(stream, &errbuf));
			void **last = buf[(CHAIN_CALLS - 1) % 2];
			uint16_t *dst = sync ? want : got;
			CHECK(dptp_cuda_memcpy(dst, last[0], out_bytes, NULL, &errbuf));
			CHECK(dptp_cuda_memcpy(dst + t * h, last[1], out_bytes, NULL, &errbuf));
		}
		if (memcmp(want, got, 2 * out_bytes))
			note_failure("residual+RMSNorm variant %zu: %d chained calls back to back "
				     "differ from the same calls synchronised", vi, CHAIN_CALLS);
		checked++;
	}
	for (int k = 0; k < 2; k++) {
		dptp_cuda_free(in[k]);
		dptp_cuda_free(buf[k][0]);
		dptp_cuda_free(buf[k][1]);
	}
	dptp_cuda_free(gamma);
	dptp_cuda_stream_destroy(stream);
	free(host);
	free(want);
	free(got);
	fprintf(stderr, "chained residual+RMSNorm calls (%d, back to back vs synchronised): "
			"%d variants checked\n", CHAIN_CALLS, checked);
	return checked;
}

/* Checks set 0's outputs: residual_out exact; returns the largest norm_out
 * error in ulp against a float64 reference (the caller allows 1, as the
 * correctness sweep does), or -1 when residual_out is wrong or NaN shows. */
static double norm_exactness(const struct norm_set *b, size_t t, size_t h, uint16_t *ro,
			     uint16_t *no)
{
	const size_t count = t * h;
	CHECK(dptp_cuda_memcpy(ro, b->ro, count * 2, NULL, &errbuf));
	CHECK(dptp_cuda_memcpy(no, b->no, count * 2, NULL, &errbuf));
	double worst = 0;
	for (size_t r = 0; r < t; r++) {
		double ss = 0;
		for (size_t c = 0; c < h; c++) {
			const size_t i = r * h + c;
			const double want = (double)in_x(0, i) + (double)in_res(i);
			if ((double)from_bf16(ro[i]) != want)
				return -1;
			ss += want * want;
		}
		const double rstd = 1.0 / sqrt(ss / (double)h + 1e-6);
		for (size_t c = 0; c < h; c++) {
			const size_t i = r * h + c;
			const double want = ((double)in_x(0, i) + (double)in_res(i)) * rstd * in_gamma(c);
			const double e = fabs((double)from_bf16(no[i]) - want) / ulp(want, DPTP_DTYPE_BF16);
			if (isnan(e))
				return -1;
			worst = fmax(worst, e);
		}
	}
	return worst;
}

static double copy_b2b_us(size_t bytes, void *stream, void *e0, void *e1)
{
	void *a = NULL, *b = NULL;
	CHECK(dptp_cuda_malloc(&a, bytes, &errbuf));
	CHECK(dptp_cuda_malloc(&b, bytes, &errbuf));
	CHECK(dptp_cuda_memset(a, 1, bytes, NULL, &errbuf));
	float us[B2B_REPS];
	for (int rep = -1; rep < B2B_REPS; rep++) {
		CHECK(dptp_cuda_event_record(e0, stream, &errbuf));
		for (int c = 0; c < B2B_CALLS; c++)
			CHECK(dptp_cuda_memcpy(c % 2 ? a : b, c % 2 ? b : a, bytes, stream, &errbuf));
		CHECK(dptp_cuda_event_record(e1, stream, &errbuf));
		CHECK(dptp_cuda_event_sync(e1, &errbuf));
		if (rep >= 0) {
			CHECK(dptp_cuda_event_elapsed_ms(e0, e1, &us[rep], &errbuf));
			us[rep] *= 1000.f / B2B_CALLS;
		}
	}
	dptp_cuda_free(a);
	dptp_cuda_free(b);
	return median(us, B2B_REPS);
}

static void bench_norm(FILE *js, double copy_gbs)
{
	const size_t shapes[][2] = {{2048, 8192}, {16384, 8192}};
	const size_t nvar = sizeof(norm_variants) / sizeof(norm_variants[0]);
	void *stream = NULL, *e0 = NULL, *e1 = NULL, *gamma = NULL;
	CHECK(dptp_cuda_stream_create(&stream, &errbuf));
	CHECK(dptp_cuda_event_create(&e0, &errbuf));
	CHECK(dptp_cuda_event_create(&e1, &errbuf));
	CHECK(dptp_cuda_malloc(&gamma, 32768 * 2, &errbuf));
	uint16_t *g = malloc(32768 * 2);
	for (size_t i = 0; i < 32768; i++)
		g[i] = to_bf16(in_gamma(i));
	CHECK(dptp_cuda_memcpy(gamma, g, 32768 * 2, NULL, &errbuf));
	free(g);
	fprintf(js, ",\n  \"norm\": {\"copy_gbps\": %.1f, \"b2b_calls\": %d, \"rows\": [", copy_gbs,
		B2B_CALLS);
	fprintf(stderr, "\nresidual + RMSNorm bf16 vs copy %.1f GB/s (single: median of %d launches, "
			"each timed alone; b2b: %d launches back to back, median of %d)\n",
		copy_gbs, ITERS, B2B_CALLS, B2B_REPS);
	fprintf(stderr, "%-14s %-44s %3s %7s %7s %10s %10s %9s %7s %8s\n", "shape", "variant", "vpt", "threads",
		"grid", "single us", "b2b us", "b2b GB/s", "% copy", "ulp");
	int firstrow = 1;
	for (size_t si = 0; si < 2; si++) {
		const size_t t = shapes[si][0], h = shapes[si][1], count = t * h, bytes = count * 2;
		/* Several input/output sets when one fits in L2 a few times over,
		 * so that back-to-back calls never find their inputs cached. */
		const int nsets = bytes <= ((size_t)64 << 20) ? 3 : 1;
		struct norm_set sets[3];
		uint16_t *hx = malloc(bytes), *hr = malloc(bytes), *ro = malloc(bytes), *no = malloc(bytes);
		if (!hx || !hr || !ro || !no) {
			fprintf(stderr, "selftest: out of host memory\n");
			exit(1);
		}
		for (size_t i = 0; i < count; i++) {
			hx[i] = to_bf16(in_x(0, i));
			hr[i] = to_bf16(in_res(i));
		}
		for (int k = 0; k < nsets; k++) {
			CHECK(dptp_cuda_malloc(&sets[k].x, bytes, &errbuf));
			CHECK(dptp_cuda_malloc(&sets[k].res, bytes, &errbuf));
			CHECK(dptp_cuda_malloc(&sets[k].ro, bytes, &errbuf));
			CHECK(dptp_cuda_malloc(&sets[k].no, bytes, &errbuf));
			CHECK(dptp_cuda_memcpy(sets[k].x, hx, bytes, NULL, &errbuf));
			CHECK(dptp_cuda_memcpy(sets[k].res, hr, bytes, NULL, &errbuf));
		}
		const double cus = copy_b2b_us(2 * bytes, stream, e0, e1);
		fprintf(stderr, "%5zux%-8zu %-44s %3s %7s %7s %10s %10.1f %9.0f\n", t, h,
			"cudaMemcpy of the same bytes", "", "", "", "", cus,
			4.0 * (double)bytes / (cus * 1e-6) / 1e9);
		fprintf(js, "%s\n   {\"tokens\": %zu, \"hidden\": %zu, \"variant\": \"copy\", "
			    "\"b2b_us\": %.2f, \"b2b_gbps\": %.1f}",
			firstrow ? "" : ",", t, h, cus, 4.0 * (double)bytes / (cus * 1e-6) / 1e9);
		firstrow = 0;
		for (size_t vi = 0; vi < nvar; vi++) {
			const struct norm_variant *v = &norm_variants[vi];
			struct dptp_ar_shape sh;
			dptp_ar_norm_shape_get(h, DPTP_DTYPE_BF16, v->vpt_min, &sh);
			const bool dflt = vi == 0;
			int grid = 0;
			/* poison, run once, check every element: the default against a
			 * float64 reference, the others bit for bit against the default */
			/* a bench-only variant that cannot launch here is a failure
			 * of the run, not the end of the table */
			if (launch_variant(v, false, &sets[0], gamma, t, h, stream, &grid) < 0) {
				note_failure("residual+RMSNorm %zux%zu variant %zu: %s", t, h, vi,
					     errbuf.msg);
				continue;
			}
			CHECK(dptp_cuda_stream_sync(stream, &errbuf));
			CHECK(dptp_cuda_memset(sets[0].ro, 0x7f, bytes, NULL, &errbuf));
			CHECK(dptp_cuda_memset(sets[0].no, 0x7f, bytes, NULL, &errbuf));
			CHECK(launch_variant(v, dflt, &sets[0], gamma, t, h, stream, NULL));
			CHECK(dptp_cuda_stream_sync(stream, &errbuf));
			double ulps = 0;
			if (dflt) {
				ulps = norm_exactness(&sets[0], t, h, ro, no);
			} else {
				CHECK(dptp_cuda_memcpy(hx, sets[0].ro, bytes, NULL, &errbuf));
				CHECK(dptp_cuda_memcpy(hr, sets[0].no, bytes, NULL, &errbuf));
				if (memcmp(hx, ro, bytes) || memcmp(hr, no, bytes))
					ulps = -1;
			}
			if (ulps < 0 || ulps > 1)
				note_failure("residual+RMSNorm %zux%zu variant %zu: %s", t, h, vi,
					     ulps < 0 ? "residual_out wrong, NaN, or not the default's bits"
						      : "norm_out over 1 ulp");
			float single[ITERS], b2b[B2B_REPS];
			for (int it = 0; it < WARMUP + ITERS; it++) {
				CHECK(dptp_cuda_event_record(e0, stream, &errbuf));
				CHECK(launch_variant(v, dflt, &sets[it % nsets], gamma, t, h, stream, NULL));
				CHECK(dptp_cuda_event_record(e1, stream, &errbuf));
				CHECK(dptp_cuda_event_sync(e1, &errbuf));
				if (it >= WARMUP)
					CHECK(dptp_cuda_event_elapsed_ms(e0, e1, &single[it - WARMUP], &errbuf));
			}
			for (int rep = 0; rep < B2B_REPS; rep++) {
				CHECK(dptp_cuda_event_record(e0, stream, &errbuf));
				for (int c = 0; c < B2B_CALLS; c++)
					CHECK(launch_variant(v, dflt, &sets[c % nsets], gamma, t, h, stream, NULL));
				CHECK(dptp_cuda_event_record(e1, stream, &errbuf));
				CHECK(dptp_cuda_event_sync(e1, &errbuf));
				CHECK(dptp_cuda_event_elapsed_ms(e0, e1, &b2b[rep], &errbuf));
				b2b[rep] /= B2B_CALLS;
			}
			const double us1 = median(single, ITERS) * 1e3, us2 = median(b2b, B2B_REPS) * 1e3;
			const double gbs = 4.0 * (double)bytes / (us2 * 1e-6) / 1e9;
			const double gbs1 = 4.0 * (double)bytes / (us1 * 1e-6) / 1e9;
			char name[64], kind[24];
			if (v->flags & DPTP_NORM_STAGED)
				snprintf(kind, sizeof(kind), "staged %d/SM",
					 DPTP_NORM_BPS_OF(v->flags) ? DPTP_NORM_BPS_OF(v->flags) : 1);
			else if (DPTP_NORM_BPS_OF(v->flags))
				snprintf(kind, sizeof(kind), "%s %d/SM",
					 v->flags & DPTP_NORM_PERSISTENT ? "persistent" : "row/block",
					 DPTP_NORM_BPS_OF(v->flags));
			else
				snprintf(kind, sizeof(kind), "%s",
					 v->flags & DPTP_NORM_PERSISTENT ? "persistent"
					 : v->flags & DPTP_NORM_PAIR	  ? "row/2-block cluster"
									  : "row/block");
			snprintf(name, sizeof(name), "%s%s%s%s%s%s", vi == 0 ? "default: " : "", kind,
				 v->flags & DPTP_NORM_PREFETCH ? "+prefetch" : "",
				 v->flags & DPTP_NORM_HINTS ? "+hints" : "",
				 v->flags & DPTP_NORM_PDL ? "+PDL" : "",
				 (v->flags & DPTP_NORM_L2PF) && (v->flags & DPTP_NORM_L2PF_LATE)
					? "+L2 prefetch x before, res after wait"
				 : v->flags & DPTP_NORM_L2PF	   ? "+L2 prefetch"
				 : v->flags & DPTP_NORM_L2PF_LINES ? "+L2 prefetch lines"
				 : v->flags & DPTP_NORM_L2PF_LATE  ? "+L2 prefetch after wait"
								   : "");
			fprintf(stderr, "%5zux%-8zu %-44s %3d %7d %7d %10.1f %10.1f %9.0f %6.1f%% %8.2f\n", t,
				h, name, sh.vpt, sh.threads, grid, us1, us2, gbs, 100.0 * gbs / copy_gbs, ulps);
			fprintf(js, "%s\n   {\"tokens\": %zu, \"hidden\": %zu, \"default\": %s, "
				    "\"vpt\": %d, \"threads\": %d, \"grid\": %d, \"flags\": %d, \"variant\": \"%s\", "
				    "\"single_us\": %.2f, \"b2b_us\": %.2f, "
				    "\"single_gbps\": %.1f, \"b2b_gbps\": %.1f, \"b2b_fraction_of_copy\": %.3f, "
				    "\"norm_max_ulp\": %.3f}",
				firstrow ? "" : ",", t, h, vi == 0 ? "true" : "false", sh.vpt, sh.threads,
				grid, v->flags, name, us1, us2, gbs1, gbs,
				gbs / copy_gbs, ulps);
			firstrow = 0;
		}
		for (int k = 0; k < nsets; k++) {
			dptp_cuda_free(sets[k].x);
			dptp_cuda_free(sets[k].res);
			dptp_cuda_free(sets[k].ro);
			dptp_cuda_free(sets[k].no);
		}
		free(hx);
		free(hr);
		free(ro);
		free(no);
	}
	const double copy_after = copy_bandwidth();
	fprintf(js, "], \"copy_gbps_after\": %.1f}", copy_after);
	fprintf(stderr, "copy 1 GiB: %.1f GB/s before these rows, %.1f GB/s after\n", copy_gbs,
		copy_after);
	dptp_cuda_free(gamma);
	dptp_cuda_stream_destroy(stream);
	dptp_cuda_event_destroy(e0);
	dptp_cuda_event_destroy(e1);
}

static void bench(FILE *js, bool norm_only)
{
	const size_t maxc = 2048 * 8192;
	const double copy_gbs = copy_bandwidth();
	if (norm_only) {
		fprintf(js, ",\n \"bench\": {\"dtype\": \"bf16\", \"copy_gbps\": %.1f", copy_gbs);
		bench_norm(js, copy_gbs);
		fprintf(js, "}");
		return;
	}
	fprintf(js, ",\n \"bench\": {\"dtype\": \"bf16\", \"warmup\": %d, \"iters\": %d, "
		    "\"copy_gbps\": %.1f,\n  \"rows\": [", WARMUP, ITERS, copy_gbs);
	fprintf(stderr, "\nbench bf16 (median of %d, us; fused ranks run concurrently on one GPU)\n",
		ITERS);
	fprintf(stderr, "%6s %7s %3s %10s %10s %10s %8s\n", "hidden", "tokens", "tp", "norm", "oneshot",
		"twoshot", "auto");
	int first = 1;
	const int tps[] = {2, 4, 8};
	struct world ws[3];
	for (int i = 0; i < 3; i++) {
		world_create(&ws[i], tps[i], DPTP_DTYPE_BF16, maxc * 2, 32768);
		fill_inputs(&ws[i], maxc);
	}
	for (size_t hi = 0; hi < 2; hi++) {
		size_t h = sweep_hidden[hi];
		for (int i = 0; i < 3; i++)
			ws[i].max_blocks = blocks_for(&ws[i], h);
		for (size_t ti = 0; ti < sizeof(sweep_tokens) / sizeof(sweep_tokens[0]); ti++) {
			size_t t = sweep_tokens[ti];
			const int keep = ws[0].max_blocks;
			ws[0].max_blocks = 0; /* the default grid, as the lead's --bench runs it */
			float norm_us = time_norm(&ws[0], t, h);
			ws[0].max_blocks = keep;
			for (int i = 0; i < 3; i++) {
				struct world *w = &ws[i];
				float one = time_fused(w, t, h, DPTP_AR_ONESHOT);
				float two = t >= (size_t)w->n ? time_fused(w, t, h, DPTP_AR_TWOSHOT) : -1.f;
				enum dptp_ar_algo au = dptp_ar_choose(w->n, t, h, DPTP_DTYPE_BF16);
				fprintf(stderr, "%6zu %7zu %3d %10.1f %10.1f %10.1f %8s\n", h, t, w->n,
					(double)norm_us, (double)one, (double)two, dptp_ar_algo_name(au));
				char twos[32];
				if (two < 0)
					snprintf(twos, sizeof(twos), "null");
				else
					snprintf(twos, sizeof(twos), "%.2f", (double)two);
				fprintf(js, "%s\n   {\"hidden\": %zu, \"tokens\": %zu, \"tp\": %d, "
					    "\"norm_us\": %.2f, \"oneshot_us\": %.2f, \"twoshot_us\": %s, "
					    "\"auto\": \"%s\"}",
					first ? "" : ",", h, t, w->n, (double)norm_us, (double)one, twos,
					dptp_ar_algo_name(au));
				first = 0;
			}
		}
	}
	for (int i = 0; i < 3; i++)
		world_destroy(&ws[i]);
	fprintf(js, "]");
	bench_norm(js, copy_gbs);
	fprintf(js, "}");
}

int main(int argc, char **argv)
{
	bool do_bench = true, quick = false, norm_bench = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--no-bench"))
			do_bench = false;
		else if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--norm-bench"))
			norm_bench = quick = true;
		else {
			fprintf(stderr, "usage: dptp-kernel-selftest [--no-bench] [--quick] [--norm-bench]\n");
			return 2;
		}
	}
	int count = 0;
	if (dptp_cuda_device_count(&count, &errbuf) < 0 || count == 0) {
		printf("{\"tool\": \"dptp-kernel-selftest\", \"status\": \"skip\", \"reason\": \"no CUDA device\"}\n");
		return 77;
	}
	int dev = 0;
	CHECK(dptp_cuda_set_device(0, &errbuf));
	CHECK(dptp_cuda_get_device(&dev, &errbuf));
	char name[128], pci[64], uuid[64];
	int sms = 0, ccmaj = 0, ccmin = 0;
	CHECK(dptp_cuda_device_info(dev, name, sizeof(name), &sms, &ccmaj, &ccmin, &errbuf));
	CHECK(dptp_cuda_device_pci_bus_id(dev, pci, sizeof(pci), &errbuf));
	CHECK(dptp_cuda_device_uuid(dev, uuid, sizeof(uuid), &errbuf));
	fprintf(stderr, "device %d: %s, %d SMs, sm_%d%d, %s, %s\n", dev, name, sms, ccmaj, ccmin, pci,
		uuid);

	bool ipc_ok = test_ipc();
	double to1 = 0, to2 = 0;
	test_timeout(&to1, &to2);
	test_correctness(quick);
	const int chain_variants = test_chain();

	FILE *js = stdout;
	fprintf(js, "{\"tool\": \"dptp-kernel-selftest\",\n \"device\": {\"ordinal\": %d, \"name\": \"%s\", "
		    "\"sms\": %d, \"cc\": \"%d.%d\", \"pci\": \"%s\", \"uuid\": \"%s\", \"count\": %d},\n",
		dev, name, sms, ccmaj, ccmin, pci, uuid, count);
	fprintf(js, " \"ipc\": \"%s\",\n \"timeout\": {\"oneshot_s\": %.3f, \"twoshot_s\": %.3f},\n",
		ipc_ok ? "pass" : "fail", to1, to2);
	fprintf(js, " \"chained_calls\": {\"calls\": %d, \"variants\": %d},\n", CHAIN_CALLS,
		chain_variants);
	fprintf(js, " \"correctness\": [");
	const char *algo_slot[] = {"oneshot", "twoshot", "auto"};
	int first = 1;
	for (int d = 0; d < 3; d++)
		for (int l = 0; l < 4; l++)
			for (int s = 0; s < 3; s++) {
				struct tally *t = &tallies[d][l][s];
				if (!t->cases)
					continue;
				fprintf(js, "%s\n  {\"dtype\": \"%s\", \"tp\": %d, \"algo\": \"%s\", "
					    "\"cases\": %d, \"failures\": %d, \"residual_max_abs_err\": %g, "
					    "\"norm_max_abs_err\": %g, \"norm_max_ulp\": %.3f}",
					first ? "" : ",", dtname((enum dptp_dtype)d), 1 << l,
					l == 0 ? "norm" : algo_slot[s], t->cases, t->failures,
					t->res_max_abs, t->norm_max_abs, t->norm_max_ulp);
				first = 0;
			}
	fprintf(js, "],\n \"failures\": [%s]", failures_json);
	if (do_bench && total_failures == 0)
		bench(js, norm_bench);
	else if (do_bench)
		fprintf(stderr, "bench skipped: the kernels are not correct\n");
	fprintf(js, ",\n \"status\": \"%s\"}\n", total_failures ? "fail" : "pass");
	fprintf(stderr, "\nselftest: %s (%d failures)\n", total_failures ? "FAIL" : "pass",
		total_failures);
	return total_failures ? 1 : 0;
}
