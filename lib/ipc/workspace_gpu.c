/* The fused-allreduce workspace on GPUs: a cuMem buffer per rank on the
 * workspace's device, exported as a POSIX fd, passed around the exchange
 * group through the opId's socket and mapped by the peers; then the fused
 * kernel (kernels/kernels.h) on it. */
#include "ipc/workspace_gpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dptp-config.h"
#include "plane/device.h"

#if DPTP_HAVE_CUDA

#include "kernels.h"

_Static_assert(DPTP_GPU_WS_MAX_RANKS == DPTP_AR_MAX_RANKS, "one limit for the kernels and the workspace");



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
	r = dptp_ipc_bind(job, &ws->sock, rank, opid, &e);
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

int dptp_gpu_workspace_blocks(struct dptp_gpu_workspace *ws, size_t hidden, struct dptp_err *err)
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
	int mb = dptp_gpu_workspace_blocks(ws, (size_t)hidden, err);
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

#endif

static int gpu_create(void **ws, const struct dptp_ipc_job *job, const struct dptp_group *xg, int rank,
		      int size, size_t max_bytes, enum dptp_dtype dt, struct dptp_err *err)
{
	return dptp_gpu_workspace_create((struct dptp_gpu_workspace **)ws, job, xg, rank, size, max_bytes, dt, err);
}

static int gpu_fused(void *ws, const void *x, const void *residual_in, const void *gamma, void *residual_out,
		     void *norm_out, int tokens, int hidden, float eps, double deadline, const char **algo,
		     struct dptp_err *err)
{
	return dptp_gpu_workspace_fused(ws, x, residual_in, gamma, residual_out, norm_out, tokens, hidden, eps,
					deadline, algo, err);
}

static void gpu_destroy(void *ws)
{
	dptp_gpu_workspace_destroy(ws);
}

const struct dptp_ws_ops dptp_ws_gpu_ops = {
	.name = "gpu",
	.alone = true,
	.place = " on the GPU",
	.create = gpu_create,
	.fused = gpu_fused,
	.destroy = gpu_destroy,
};

#if !DPTP_HAVE_CUDA /* no CUDA in this build */

int dptp_gpu_workspace_create(struct dptp_gpu_workspace **out, const struct dptp_ipc_job *job,
			      const struct dptp_group *xg, int rank, int size, size_t max_bytes,
			      enum dptp_dtype dt, struct dptp_err *err)
{
	return dptp_no_cuda(err);
}
void dptp_gpu_workspace_destroy(struct dptp_gpu_workspace *ws) {}
int dptp_gpu_workspace_fused(struct dptp_gpu_workspace *ws, const void *x, const void *residual_in,
			     const void *gamma, void *residual_out, void *norm_out, int tokens,
			     int hidden, float eps, double deadline, const char **algo,
			     struct dptp_err *err)
{
	return dptp_no_cuda(err);
}
int dptp_gpu_workspace_blocks(struct dptp_gpu_workspace *ws, size_t hidden, struct dptp_err *err)
{
	return dptp_no_cuda(err);
}

#endif
