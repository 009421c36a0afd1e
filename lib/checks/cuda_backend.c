/* The cuda backend: device choice from LOCAL_RANK, the GPU data plane and
 * the GPU workspace. Kernels are reached only through kernels/kernels.h. */
#include "checks/cuda_backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dptp-config.h"
#include "report/report.h"

#if DPTP_HAVE_CUDA

#include "plane/comm_nccl.h"
#include "kernels.h"
#include "ipc/workspace.h"

int dptp_cuda_visible_devices(void)
{
	int n = 0;
	return dptp_cuda_device_count(&n, NULL) == 0 ? n : 0;
}

int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err)
{
	char uuid[64] = "", pci[64] = "";
	DPTP_TRY(dptp_cuda_device_uuid(ordinal, uuid, sizeof(uuid), err));
	DPTP_TRY(dptp_cuda_device_pci_bus_id(ordinal, pci, sizeof(pci), err));
	snprintf(id, n, "%s (pci %s)", uuid, pci);
	return 0;
}

int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err)
{
	DPTP_TRY(dptp_cuda_set_device(ordinal, err));
	return id ? dptp_cuda_device_id(ordinal, id, n, err) : 0;
}

int dptp_cuda_nccl_probe(struct dptp_ctx *c, const struct dptp_group *g, struct dptp_err *err)
{
#if DPTP_HAVE_NCCL
	return dptp_nccl_probe(g->size, g->index, &c->x, g, err);
#else
	dptp_xchg_barrier(&c->x, g, NULL); /* lockstep */
	return dptp_err_set(err, -ENOTSUP, "built without NCCL");
#endif
}

/* ---- the host data plane staged through device memory ---- */

struct stage_impl {
	struct dptp_comm *host;
	void *tmp;
	size_t cap;
};

static void *stage_tmp(struct stage_impl *s, size_t bytes)
{
	if (bytes > s->cap) {
		void *p = realloc(s->tmp, bytes);
		if (!p)
			return NULL;
		s->tmp = p;
		s->cap = bytes;
	}
	return s->tmp;
}

static int stage_bcast(struct dptp_comm *c, const struct dptp_group *g, void *buf, size_t bytes,
		       int root, struct dptp_err *err)
{
	struct stage_impl *s = c->impl;
	void *t = stage_tmp(s, bytes);
	if (!t || dptp_cuda_memcpy(t, buf, bytes, NULL, err) < 0) {
		s->host->ops->bcast(s->host, g, NULL, 0, -1, NULL); /* lockstep */
		return t ? -EIO : dptp_err_set(err, -ENOMEM, "out of memory");
	}
	DPTP_TRY(s->host->ops->bcast(s->host, g, t, bytes, root, err));
	return dptp_cuda_memcpy(buf, t, bytes, NULL, err);
}

static int stage_allgather(struct dptp_comm *c, const struct dptp_group *g, const void *send,
			   void *recv, size_t bytes, struct dptp_err *err)
{
	struct stage_impl *s = c->impl;
	size_t total = bytes * (size_t)(g->size + 1);
	char *t = stage_tmp(s, total);
	int rc = t ? dptp_cuda_memcpy(t, send, bytes, NULL, err) : dptp_err_set(err, -ENOMEM, "out of memory");
	int rc2 = s->host->ops->allgather(s->host, g, t ? t : "", t ? t + bytes : NULL, rc < 0 ? 0 : bytes, err);
	if (rc < 0)
		return rc;
	DPTP_TRY(rc2);
	return dptp_cuda_memcpy(recv, t + bytes, bytes * (size_t)g->size, NULL, err);
}

static int stage_allreduce(struct dptp_comm *c, const struct dptp_group *g, void *buf,
			   size_t count, enum dptp_dtype dt, struct dptp_err *err)
{
	struct stage_impl *s = c->impl;
	size_t bytes = count * dptp_dtype_bytes(dt);
	void *t = stage_tmp(s, bytes);
	int rc = t ? dptp_cuda_memcpy(t, buf, bytes, NULL, err) : dptp_err_set(err, -ENOMEM, "out of memory");
	int rc2 = s->host->ops->allreduce(s->host, g, t, rc < 0 ? 0 : count, dt, err);
	if (rc < 0)
		return rc;
	DPTP_TRY(rc2);
	return dptp_cuda_memcpy(buf, t, bytes, NULL, err);
}

static void *stage_alloc(struct dptp_comm *c, size_t bytes)
{
	void *p = NULL;
	return dptp_cuda_malloc(&p, bytes ? bytes : 1, NULL) == 0 ? p : NULL;
}

static void stage_free(struct dptp_comm *c, void *p)
{
	dptp_cuda_free(p);
}

static int stage_copy(struct dptp_comm *c, void *dst, const void *src, size_t bytes)
{
	return dptp_cuda_memcpy(dst, src, bytes, NULL, NULL);
}

static void stage_destroy(struct dptp_comm *c)
{
	if (!c)
		return;
	struct stage_impl *s = c->impl;
	if (s) {
		dptp_comm_destroy(s->host);
		free(s->tmp);
		free(s);
	}
	free(c);
}

static const struct dptp_comm_ops stage_ops = {
	.name = "host-staged",
	.bcast = stage_bcast,
	.allgather = stage_allgather,
	.allreduce = stage_allreduce,
	.alloc = stage_alloc,
	.free = stage_free,
	.upload = stage_copy,
	.download = stage_copy,
	.destroy = stage_destroy,
};

int dptp_cuda_ctx_setup(struct dptp_ctx *c, struct dptp_err *err)
{
	int count = 0;
	int rc = dptp_cuda_device_count(&count, err);
	int lr = c->peers[c->rank].local_rank;
	const char *sh = getenv("DPTP_GPU_SHARING");
	bool sharing = sh && strcmp(sh, "1") == 0;
	int32_t ord = -1;
	if (rc == 0 && count == 0)
		rc = dptp_err_set(err, -ENODEV, "no CUDA device is visible");
	else if (rc == 0 && lr >= count && !sharing)
		rc = dptp_err_set(err, -ENODEV,
			"LOCAL_RANK %d has no GPU: %d visible (CUDA_VISIBLE_DEVICES=%s); "
			"run one rank per GPU, or set DPTP_GPU_SHARING=1 to share GPUs (testing only)",
			lr, count, getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
	if (rc == 0) {
		ord = sharing ? lr % count : lr;
		rc = dptp_cuda_set_device(ord, err);
	}
	/* everyone learns everyone's device, and whether any GPU is shared */
	int32_t *ords = calloc((size_t)c->layout.world, sizeof(int32_t));
	if (!ords)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	struct dptp_err e2 = {0};
	int arc = dptp_xchg_allgather(&c->x, &c->world, &ord, sizeof(ord), ords, &e2);
	bool shared = false, failed = false;
	for (int r = 0; arc == 0 && r < c->layout.world; r++) {
		c->peers[r].device = ords[r];
		failed |= ords[r] < 0;
		for (int q = 0; q < r; q++)
			shared |= c->host_of[q] == c->host_of[r] && ords[q] == ords[r];
	}
	free(ords);
	if (rc < 0)
		return rc;
	if (arc < 0) {
		if (err)
			*err = e2;
		return arc;
	}
	if (failed)
		return dptp_err_set(err, -ENODEV, "another rank has no usable GPU");

	struct dptp_comm *nc = NULL;
#if DPTP_HAVE_NCCL
	if (!shared) {
		const struct dptp_group *groups[] = { &c->tp, &c->pp, &c->dp, &c->ep };
		rc = dptp_comm_nccl_create(&nc, &c->x, ord, groups, 4, err);
		if (rc < 0) {
			dptp_err_prefix(err, "NCCL data plane");
			return rc;
		}
		dptp_comm_destroy(c->comm);
		c->comm = nc;
		return 0;
	}
#endif
	/* ranks share a GPU (NCCL would refuse: "Duplicate GPU detected"), or
	 * no NCCL: the host data plane, staged through device memory */
	nc = calloc(1, sizeof(*nc));
	struct stage_impl *s = calloc(1, sizeof(*s));
	if (!nc || !s) {
		free(nc);
		free(s);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	s->host = c->comm;
	nc->ops = &stage_ops;
	nc->x = &c->x;
	nc->impl = s;
	c->comm = nc;
	return 0;
}

/* ---- the GPU workspace ---- */

struct dptp_gpu_workspace {
	int rank, size, ordinal;
	enum dptp_dtype dt;
	size_t max_bytes, buf_bytes;
	struct dptp_cuda_mem *mine;
	struct dptp_cuda_mem *peer[DPTP_AR_MAX_RANKS];
	struct dptp_cuda_ar *ar;
	struct dptp_ipcsock sock;
	void *stream;
	void *d_x, *d_res_in, *d_gamma, *d_res_out, *d_norm;
	int sharing;  /* ranks on this GPU */
};


void dptp_gpu_workspace_destroy(struct dptp_gpu_workspace *ws)
{
	if (!ws)
		return;
	dptp_cuda_ar_destroy(ws->ar);
	for (int j = 0; j < DPTP_AR_MAX_RANKS; j++)
		dptp_cuda_mem_destroy(ws->peer[j]);
	dptp_cuda_mem_destroy(ws->mine);
	dptp_cuda_free(ws->d_x);
	dptp_cuda_free(ws->d_res_in);
	dptp_cuda_free(ws->d_gamma);
	dptp_cuda_free(ws->d_res_out);
	dptp_cuda_free(ws->d_norm);
	dptp_cuda_stream_destroy(ws->stream);
	dptp_ipcsock_close(&ws->sock);
	free(ws);
}

int dptp_gpu_workspace_create(struct dptp_gpu_workspace **out, const struct dptp_ipc_job *job,
			      const struct dptp_group *xg, int rank, int size, size_t max_bytes,
			      enum dptp_dtype dt, struct dptp_err *err)
{
	struct dptp_gpu_workspace *ws = calloc(1, sizeof(*ws));
	if (!ws)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	ws->sock.fd = -1;
	ws->rank = rank;
	ws->size = size;
	ws->dt = dt;
	ws->max_bytes = max_bytes;
	int rc = 0;
	struct dptp_err e = {0};
	if (size < 1 || size > DPTP_AR_MAX_RANKS)
		rc = dptp_err_set(err, -EINVAL, "TP size %d: the fused kernels support 1, 2, 4 and 8 ranks", size);

	/* the root draws the opId and broadcasts it in the exchange group */
	uint64_t opid;
	int r = dptp_opid_agree(job, xg, rank, &opid, &e);
	if (r < 0)
		dptp_err_prefix(&e, "opId broadcast");
	dptp_err_keep(&rc, err, r, &e);

	/* memory on the workspace's device, which it also makes current */
	ws->ordinal = dptp_workspace_device(job);
	for (int q = 0; q < job->world; q++)
		ws->sharing += job->peers[q].host == job->peers[job->rank].host && job->peers[q].device == job->peers[job->rank].device;
	int fd = -1;
	if (rc == 0)
		dptp_err_keep(&rc, err, dptp_cuda_set_device(ws->ordinal, &e), &e);
	ws->buf_bytes = dptp_cuda_ar_buffer_bytes(size, max_bytes);
	if (rc == 0)
		dptp_err_keep(&rc, err, dptp_cuda_mem_create(ws->ordinal, ws->buf_bytes, &ws->mine, &e), &e);
	if (rc == 0) {
		ws->buf_bytes = dptp_cuda_mem_size(ws->mine);
		dptp_err_keep(&rc, err, dptp_cuda_mem_export(ws->mine, &fd, &e), &e);
	}
	r = dptp_ipcsock_bind(&ws->sock, rank, opid, &e);
	if (r < 0)
		dptp_err_prefix(&e, "global rank %d (group rank %d of %d)", job->rank, rank, size);
	dptp_err_keep(&rc, err, r, &e);

	int in[DPTP_AR_MAX_RANKS + 1];
	int *inp[1] = { in };
	int n = size >= 1 && size <= DPTP_AR_MAX_RANKS ? size : 1;
	dptp_err_keep(&rc, err, dptp_fd_ring(job, xg, rank, n, &ws->sock, 1, &fd, inp, &e), &e);
	if (fd >= 0)
		close(fd);
	void *bufs[DPTP_AR_MAX_RANKS] = {0};
	for (int j = 0; j < n; j++) {
		if (j == rank) {
			if (in[j] >= 0)
				close(in[j]);
			bufs[j] = ws->mine ? dptp_cuda_mem_ptr(ws->mine) : NULL;
			continue;
		}
		if (in[j] < 0) {
			if (rc == 0)
				rc = dptp_err_set(err, -ENOENT, "no descriptor from group rank %d", j);
			continue;
		}
		if (rc == 0)
			dptp_err_keep(&rc, err, dptp_cuda_mem_import(ws->ordinal, in[j], ws->buf_bytes, &ws->peer[j], &e), &e);
		close(in[j]);
		if (ws->peer[j])
			bufs[j] = dptp_cuda_mem_ptr(ws->peer[j]);
	}
	if (rc == 0) {
		struct dptp_cuda_ar_config cfg = { .nranks = size, .rank = rank, .dtype = dt, .max_bytes = max_bytes };
		memcpy(cfg.peer_bufs, bufs, sizeof(bufs));
		dptp_err_keep(&rc, err, dptp_cuda_ar_create(&cfg, &ws->ar, &e), &e);
	}
	if (rc == 0)
		dptp_err_keep(&rc, err, dptp_cuda_stream_create(&ws->stream, &e), &e);
	size_t hid = 0;
	(void)hid;
	if (rc == 0) {
		dptp_err_keep(&rc, err, dptp_cuda_malloc(&ws->d_x, max_bytes, &e), &e);
		dptp_err_keep(&rc, err, dptp_cuda_malloc(&ws->d_res_in, max_bytes, &e), &e);
		dptp_err_keep(&rc, err, dptp_cuda_malloc(&ws->d_res_out, max_bytes, &e), &e);
		dptp_err_keep(&rc, err, dptp_cuda_malloc(&ws->d_norm, max_bytes, &e), &e);
		dptp_err_keep(&rc, err, dptp_cuda_malloc(&ws->d_gamma, 65536 * 4, &e), &e);
	}
	/* every rank's buffer is initialised before anyone's first call */
	dptp_err_keep(&rc, err, dptp_xchg_barrier(job->x, xg, &e), &e);
	if (rc < 0) {
		dptp_gpu_workspace_destroy(ws);
		return rc;
	}
	*out = ws;
	return 0;
}

static int max_blocks(struct dptp_gpu_workspace *ws, size_t hidden, struct dptp_err *err)
{
	int blocks = 0;
	DPTP_TRY(dptp_cuda_ar_resident_blocks(ws->dt, hidden, ws->size, &blocks, err));
	/* ranks sharing one GPU must all be resident at once */
	int b = blocks / (ws->sharing > 0 ? ws->sharing : 1);
	return b > 0 ? b : 1;
}

int dptp_gpu_workspace_fused(struct dptp_gpu_workspace *ws, const void *x, const void *residual_in,
			     const void *gamma, void *residual_out, void *norm_out, int tokens,
			     int hidden, float eps, double deadline, const char **algo,
			     struct dptp_err *err)
{
	size_t bytes = (size_t)tokens * (size_t)hidden * dptp_dtype_bytes(ws->dt);
	DPTP_TRY(dptp_cuda_set_device(ws->ordinal, err));
	DPTP_TRY(dptp_cuda_memcpy(ws->d_x, x, bytes, NULL, err));
	DPTP_TRY(dptp_cuda_memcpy(ws->d_res_in, residual_in, bytes, NULL, err));
	DPTP_TRY(dptp_cuda_memcpy(ws->d_gamma, gamma, (size_t)hidden * dptp_dtype_bytes(ws->dt), NULL, err));
	int mb = max_blocks(ws, (size_t)hidden, err);
	if (mb < 0)
		return mb;
	double left = deadline - dptp_now();
	struct dptp_ar_args a = {
		.x = ws->d_x, .residual_in = ws->d_res_in, .gamma = ws->d_gamma,
		.residual_out = ws->d_res_out, .norm_out = ws->d_norm,
		.tokens = (size_t)tokens, .hidden = (size_t)hidden, .eps = eps,
		.algo = DPTP_AR_AUTO, .max_blocks = mb,
		.timeout_ns = left > 0.001 ? (uint64_t)(left * 1e9) : 1000000,
	};
	enum dptp_ar_algo used = DPTP_AR_AUTO;
	DPTP_TRY(dptp_cuda_ar_fused(ws->ar, &a, ws->stream, &used, err));
	DPTP_TRY(dptp_cuda_ar_check(ws->ar, ws->stream, err));
	if (algo)
		*algo = dptp_ar_algo_name(used);
	DPTP_TRY(dptp_cuda_memcpy(residual_out, ws->d_res_out, bytes, NULL, err));
	return dptp_cuda_memcpy(norm_out, ws->d_norm, bytes, NULL, err);
}

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

int dptp_cuda_bench(struct dptp_ctx *c, const int *tokens, int ntokens, const int *hiddens,
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
		int mb = rc == 0 ? max_blocks(ws, (size_t)h, &e) : 1;
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
				 dt == DPTP_DTYPE_BF16 ? "bf16" : dt == DPTP_DTYPE_FP16 ? "fp16" : "fp32");
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

#else /* no CUDA in this build */

static int no_cuda(struct dptp_err *err)
{
	return dptp_err_set(err, -ENOTSUP, "this dptp was built without CUDA (the cuda feature is off)");
}

int dptp_cuda_visible_devices(void) { return 0; }
int dptp_cuda_ctx_setup(struct dptp_ctx *c, struct dptp_err *err) { return no_cuda(err); }
int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err) { return no_cuda(err); }
int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err) { return no_cuda(err); }
int dptp_cuda_nccl_probe(struct dptp_ctx *c, const struct dptp_group *g, struct dptp_err *err)
{
	dptp_xchg_barrier(&c->x, g, NULL); /* lockstep */
	return no_cuda(err);
}
int dptp_gpu_workspace_create(struct dptp_gpu_workspace **out, const struct dptp_ipc_job *job,
			      const struct dptp_group *xg, int rank, int size, size_t max_bytes,
			      enum dptp_dtype dt, struct dptp_err *err)
{
	return no_cuda(err);
}
void dptp_gpu_workspace_destroy(struct dptp_gpu_workspace *ws) {}
int dptp_gpu_workspace_fused(struct dptp_gpu_workspace *ws, const void *x, const void *residual_in,
			     const void *gamma, void *residual_out, void *norm_out, int tokens,
			     int hidden, float eps, double deadline, const char **algo,
			     struct dptp_err *err)
{
	return no_cuda(err);
}
int dptp_cuda_bench(struct dptp_ctx *c, const int *tokens, int ntokens, const int *hiddens,
		    int nhidden, int iters, struct dptp_bench_row **rows, size_t *nrows,
		    struct dptp_err *err)
{
	return no_cuda(err);
}

#endif
