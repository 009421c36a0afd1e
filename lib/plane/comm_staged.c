/* The host data plane staged through device memory: buffers live on the
 * GPU, collectives copy them to the host and run the host data plane. Used
 * when ranks share a GPU (NCCL would refuse: "Duplicate GPU detected") or
 * the build has no NCCL. */
#include "plane/comm.h"

#include <errno.h>
#include <stdlib.h>

#include "dptp-config.h"
#include "plane/device.h"

#if DPTP_HAVE_CUDA

#include "kernels.h"

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

int dptp_comm_staged_create(struct dptp_comm **out, struct dptp_comm *host, struct dptp_exchange *x,
			    struct dptp_err *err)
{
	struct dptp_comm *nc = calloc(1, sizeof(*nc));
	struct stage_impl *s = calloc(1, sizeof(*s));
	if (!nc || !s) {
		free(nc);
		free(s);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	s->host = host;
	nc->ops = &stage_ops;
	nc->x = x;
	nc->impl = s;
	*out = nc;
	return 0;
}

#else

int dptp_comm_staged_create(struct dptp_comm **out, struct dptp_comm *host, struct dptp_exchange *x,
			    struct dptp_err *err)
{
	return dptp_no_cuda(err);
}

#endif
