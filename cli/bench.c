/* --bench: the fused kernel against NCCL allreduce + a separate residual /
 * RMSNorm, over a token sweep; a table and JSON (cuda feature). */
#include "bench.h"
#include "stop.h"
#include "sweep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dptp-config.h"
#include "ipc/workspace_gpu.h"
#include "plane/comm_nccl.h"
#include "plane/device.h"

#if DPTP_HAVE_CUDA

#include "kernels.h"

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Median of `iters` event pairs recorded on the stream, in microseconds. */
static int median_us(void **ev, int iters, double *us, struct dptp_err *err)
{
	float *ms = calloc((size_t)iters, sizeof(float));
	if (!ms)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc = 0;
	for (int i = 0; rc == 0 && i < iters; i++) {
		rc = dptp_cuda_event_sync(ev[2 * i + 1], err);
		if (rc == 0)
			rc = dptp_cuda_event_elapsed_ms(ev[2 * i], ev[2 * i + 1], &ms[i], err);
	}
	if (rc == 0) {
		qsort(ms, (size_t)iters, sizeof(float), cmp_float);
		*us = (double)ms[iters / 2] * 1000.0;
	}
	free(ms);
	return rc;
}

/* Fused vs NCCL allreduce + separate residual/RMSNorm over the TP group,
 * for each tokens value; fills rows (caller frees). Collective. */
static int bench_rows(struct dptp_ctx *c, const int *tokens, int ntokens, const int *hiddens,
		      int nhidden, int iters, struct dptp_bench_row **rows, size_t *nrows,
		      struct dptp_err *err)
{
	const struct dptp_group *tp = &c->tp;
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt);
	int maxtok = 0;
	for (int i = 0; i < ntokens; i++)
		if (tokens[i] > maxtok)
			maxtok = tokens[i];
	*rows = calloc((size_t)(ntokens * nhidden), sizeof(**rows));
	void **ev = calloc((size_t)iters * 2, sizeof(void *));
	if (!*rows || !ev) {
		free(ev);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	*nrows = 0;
	int rc = 0;
	for (int i = 0; rc == 0 && i < iters * 2; i++)
		rc = dptp_cuda_event_create(&ev[i], err);
	bool nccl = false;
#if DPTP_HAVE_NCCL
	nccl = dptp_comm_is_nccl(c->comm);
#endif
	for (int q = 0; q < c->layout.world; q++)
		if (q != c->rank && c->host_of[q] == c->host_of[c->rank] &&
		    c->peers[q].device == c->peers[c->rank].device) {
			if (c->rank == 0)
				fprintf(stderr, "dptp-check: bench: ranks share a GPU (DPTP_GPU_SHARING): their kernels "
					"time-slice, so these figures measure the sharing, not the kernels\n");
			break;
		}
	for (int hi = 0; hi < nhidden; hi++) {
		int h = hiddens[hi];
		size_t max_bytes = (size_t)maxtok * (size_t)h * esz;
		struct dptp_gpu_workspace *ws = NULL;
		struct dptp_err e = {0};
		int r = dptp_gpu_workspace_create(&ws, &c->ipc, tp, tp->index, tp->size, max_bytes, dt, &e);
		if (r < 0) {
			dptp_err_keep(&rc, err, r, &e);
			break;
		}
		void *d_buf = NULL, *host = malloc(max_bytes);
		r = host ? dptp_cuda_malloc(&d_buf, max_bytes, &e) : -ENOMEM;
		if (r == 0) {
			dptp_input_fill(host, (size_t)maxtok * (size_t)h, c->p.seed, (uint64_t)c->rank, dt);
			r = dptp_cuda_memcpy(ws->d_x, host, max_bytes, NULL, &e);
			if (r == 0)
				r = dptp_cuda_memcpy(d_buf, host, max_bytes, NULL, &e);
			dptp_input_fill(host, (size_t)maxtok * (size_t)h, c->p.seed, 0x12e5ULL, dt);
			if (r == 0)
				r = dptp_cuda_memcpy(ws->d_res_in, host, max_bytes, NULL, &e);
			dptp_input_fill(host, (size_t)h, c->p.seed, 0x6a33aULL, dt);
			if (r == 0)
				r = dptp_cuda_memcpy(ws->d_gamma, host, (size_t)h * esz, NULL, &e);
		}
		dptp_err_keep(&rc, err, r, &e);
		int mb = rc == 0 ? dptp_gpu_workspace_blocks(ws, (size_t)h, &e) : 1;
		for (int ti = 0; ti < ntokens; ti++) {
			int t = tokens[ti];
			struct dptp_ar_args a = {
				.x = ws->d_x, .residual_in = ws->d_res_in, .gamma = ws->d_gamma,
				.residual_out = ws->d_res_out, .norm_out = ws->d_norm,
				.tokens = (size_t)t, .hidden = (size_t)h, .eps = (float)c->p.eps,
				.algo = DPTP_AR_AUTO, .max_blocks = mb, .timeout_ns = 10000000000ULL,
			};
			struct dptp_bench_row *row = &(*rows)[*nrows];
			row->tp = tp->size;
			row->tokens = t;
			row->hidden = h;
			snprintf(row->dtype, sizeof(row->dtype), "%s",
				 dptp_dtype_name(dt));
			/* fused: warm up, line up, then one event pair per call */
			for (int w = 0; rc == 0 && w < 3; w++) {
				dptp_err_keep(&rc, err, dptp_cuda_ar_fused(ws->ar, &a, ws->stream, NULL, &e), &e);
				dptp_err_keep(&rc, err, dptp_cuda_ar_check(ws->ar, ws->stream, &e), &e);
			}
			dptp_err_keep(&rc, err, dptp_xchg_barrier(&c->x, &c->world, &e), &e);
			for (int i = 0; rc == 0 && i < iters; i++) {
				dptp_err_keep(&rc, err, dptp_cuda_event_record(ev[2 * i], ws->stream, &e), &e);
				dptp_err_keep(&rc, err, dptp_cuda_ar_fused(ws->ar, &a, ws->stream, NULL, &e), &e);
				dptp_err_keep(&rc, err, dptp_cuda_event_record(ev[2 * i + 1], ws->stream, &e), &e);
			}
			if (rc == 0)
				dptp_err_keep(&rc, err, dptp_cuda_ar_check(ws->ar, ws->stream, &e), &e);
			if (rc == 0)
				dptp_err_keep(&rc, err, median_us(ev, iters, &row->fused_us, &e), &e);
			/* unfused: NCCL allreduce, then the separate residual + RMSNorm */
			dptp_err_keep(&rc, err, dptp_xchg_barrier(&c->x, &c->world, &e), &e);
			if (nccl) {
#if DPTP_HAVE_NCCL
				struct dptp_ar_args u = a;
				u.x = d_buf;
				for (int i = -3; rc == 0 && i < iters; i++) {
					if (i >= 0)
						dptp_err_keep(&rc, err, dptp_cuda_event_record(ev[2 * i], ws->stream, &e), &e);
					dptp_err_keep(&rc, err, dptp_comm_nccl_allreduce_on(c->comm, tp, d_buf, (size_t)t * (size_t)h,
										   dt, ws->stream, &e), &e);
					dptp_err_keep(&rc, err, dptp_cuda_residual_rmsnorm(&u, dt, ws->stream, &e), &e);
					if (i >= 0)
						dptp_err_keep(&rc, err, dptp_cuda_event_record(ev[2 * i + 1], ws->stream, &e), &e);
				}
				if (rc == 0)
					dptp_err_keep(&rc, err, median_us(ev, iters, &row->unfused_us, &e), &e);
#endif
			}
			double bytes = (double)t * h * (double)esz;
			double factor = tp->size > 1 ? 2.0 * (tp->size - 1) / tp->size : 1.0;
			if (row->fused_us > 0)
				row->fused_busbw_gbs = bytes * factor / row->fused_us / 1e3;
			if (row->unfused_us > 0) {
				row->unfused_busbw_gbs = bytes * factor / row->unfused_us / 1e3;
				if (tp->size > 1) /* at TP 1 nothing is fused */
					row->speedup = row->unfused_us / row->fused_us;
			}
			(*nrows)++;
			if (rc < 0)
				break;
			if (c->rank == 0 && isatty(2))
				fprintf(stderr, "\rdptp-check: bench hidden %d tokens %d: fused %.1f us   ", h, t, row->fused_us);
		}
		if (c->rank == 0 && isatty(2))
			fprintf(stderr, "\n");
		dptp_cuda_free(d_buf);
		free(host);
		dptp_gpu_workspace_destroy(ws);
		if (rc < 0)
			break;
	}
	for (int i = 0; i < iters * 2; i++)
		dptp_cuda_event_destroy(ev[i]);
	free(ev);
	return rc;
}

#else

static int bench_rows(struct dptp_ctx *c, const int *tokens, int ntokens, const int *hiddens,
		      int nhidden, int iters, struct dptp_bench_row **rows, size_t *nrows,
		      struct dptp_err *err)
{
	return dptp_no_cuda(err);
}

#endif


/* --bench: fused vs unfused over a token sweep, a table and JSON. */
int dptp_check_bench(const struct dptp_options *o, struct dptp_ctx *c, struct dptp_bootstrap *b)
{
	static const int tokens[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048 };
	int hiddens[2] = { 4096, 8192 }, nh = 2;
	if (o->hidden != 4096) { /* an explicit --hidden narrows the sweep */
		hiddens[0] = o->hidden;
		nh = 1;
	}
	int nt = 0;
	while (nt < (int)DPTP_ARRAY_LEN(tokens) && tokens[nt] <= (o->tokens > 128 ? o->tokens : 2048))
		nt++;
	const char *it = getenv("DPTP_BENCH_ITERS");
	uint64_t iters = 50;
	struct dptp_err err = {0};
	struct dptp_bench_row *rows = NULL;
	size_t nrows = 0;
	int rc = 0;
	if (it && *it && dptp_parse_u64(it, 1, 1000000, false, &iters) < 0)
		rc = dptp_err_set(&err, -EINVAL, "invalid DPTP_BENCH_ITERS='%s': expected an integer in 1..1000000", it);
	c->x.deadline = dptp_now() + o->timeout * 10;
	if (rc == 0)
		rc = bench_rows(c, tokens, nt, hiddens, nh, (int)iters, &rows, &nrows, &err);
	int code = EXIT_PASS;
	if (rc < 0) {
		fprintf(stderr, "dptp-check: rank %d: bench: %s\n", c->rank, err.msg);
		code = rc == -ETIMEDOUT ? EXIT_TIMEOUT : EXIT_ENV;
	}
	if (c->rank == 0 && rc < 0 && dptp_stop_claim()) {
		/* the rows measured, if any, and the error as each replica's
		 * "bench" entry (rank 0's words: the others' are on their
		 * stderr) */
		char why[DPTP_ERR_MAX + 32];
		snprintf(why, sizeof(why), "rank 0: bench: %s", err.msg);
		code = dptp_stop_report_not_run(o, b, c->layout.world, true, rc == -ETIMEDOUT ? DPTP_TIMEOUT : DPTP_ERROR,
						why, code, rows, nrows);
		dptp_stop_done(code);
	} else if (c->rank == 0 && dptp_stop_claim()) {
		struct dptp_report rep = {
			.tool = "dptp-check", .version = DPTP_VERSION,
			.world = c->layout.world, .dp = c->layout.dp, .pp = c->layout.pp, .tp = c->layout.tp,
			.backend = "cuda", .bootstrap = b->ops->name, .engine = b->engine, .seed = o->seed,
			.nbench = nrows, .bench = rows,
		};
		code = dptp_cli_write_report(o, &rep, code, false);
		dptp_stop_done(code);
	}
	free(rows);
	c->x.deadline = dptp_now() + 5;
	dptp_xchg_barrier(&c->x, &c->world, NULL);
	dptp_ctx_release(c);
	dptp_bootstrap_destroy(b);
	return code;
}
