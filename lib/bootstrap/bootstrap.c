#include "bootstrap/bootstrap.h"
#include "base/host.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int pick(struct dptp_bootstrap **out, double timeout, struct dptp_err *err)
{
	const char *ns = getenv("PMIX_NAMESPACE");
	if (ns && *ns)
		return dptp_bootstrap_pmix_create(out, err);
	const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
	if (rank && world && getenv("MASTER_ADDR") && getenv("MASTER_PORT"))
		return dptp_bootstrap_torchrun_create(out, timeout, err);
	uint64_t w = 0;
	if (world && (dptp_parse_u64(world, 1, 1, false, &w) < 0))
		return dptp_err_set(err, -EINVAL,
			"WORLD_SIZE=%s but no launcher to reach the other ranks: "
			"PMIX_NAMESPACE, or RANK, MASTER_ADDR and MASTER_PORT, are not set; "
			"use dptp-run, torchrun, mpirun or srun --mpi=pmix", world);
	return dptp_bootstrap_single_create(out, err);
}

int dptp_bootstrap_create(struct dptp_bootstrap **out, double timeout, struct dptp_err *err)
{
	DPTP_TRY(pick(out, timeout, err));
	/* DPTP_HOSTNAME: which host this rank counts as (dptp_hostname) */
	if (getenv("DPTP_HOSTNAME"))
		dptp_hostname((*out)->hostname, sizeof((*out)->hostname));
	return 0;
}

void dptp_bootstrap_destroy(struct dptp_bootstrap *b)
{
	if (b && b->ops)
		b->ops->destroy(b);
}

int dptp_bootstrap_put(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		       struct dptp_err *err)
{
	b->put_bytes += len;
	return b->ops->put(b, key, data, len, err);
}

int dptp_bootstrap_fence(struct dptp_bootstrap *b, double timeout, struct dptp_err *err)
{
	if (timeout <= 0)
		return dptp_err_set(err, -ETIMEDOUT, "no time left for a fence");
	b->nfences++;
	return b->ops->fence(b, timeout, err);
}

int dptp_bootstrap_publish(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
			   struct dptp_err *err)
{
	b->put_bytes += len;
	return b->ops->publish(b, key, data, len, err);
}

int dptp_bootstrap_get(struct dptp_bootstrap *b, int rank, const char *key, void **data,
		       size_t *len, double timeout, struct dptp_err *err)
{
	if (rank < 0 || rank >= b->size)
		return dptp_err_set(err, -EINVAL, "rank %d is outside the world of %d", rank, b->size);
	return b->ops->get(b, rank, key, data, len, timeout, err);
}

/* ---- single process ---- */

struct kv {
	char *key;
	void *data;
	size_t len;
	struct kv *next;
};

static int single_put(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		      struct dptp_err *err)
{
	struct kv *e = calloc(1, sizeof(*e));
	if (!e || !(e->key = strdup(key)) || !(e->data = malloc(len ? len : 1))) {
		if (e)
			free(e->key);
		free(e);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	memcpy(e->data, data, len);
	e->len = len;
	e->next = b->impl;
	b->impl = e;
	return 0;
}

static int single_fence(struct dptp_bootstrap *b, double timeout, struct dptp_err *err)
{
	return 0;
}

static int single_get(struct dptp_bootstrap *b, int rank, const char *key, void **data,
		      size_t *len, double timeout, struct dptp_err *err)
{
	for (struct kv *e = b->impl; e; e = e->next) {
		if (strcmp(e->key, key) == 0) {
			*data = malloc(e->len ? e->len : 1);
			if (!*data)
				return dptp_err_set(err, -ENOMEM, "out of memory");
			memcpy(*data, e->data, e->len);
			*len = e->len;
			return 0;
		}
	}
	return dptp_err_set(err, -ENOENT, "key '%s' of rank %d not found", key, rank);
}

static void single_abort(struct dptp_bootstrap *b, int status, const char *msg)
{
}

static void single_destroy(struct dptp_bootstrap *b)
{
	struct kv *e = b->impl;
	while (e) {
		struct kv *n = e->next;
		free(e->key);
		free(e->data);
		free(e);
		e = n;
	}
	free(b);
}

static const struct dptp_bootstrap_ops single_ops = {
	.name = "single",
	.put = single_put,
	.fence = single_fence,
	.publish = single_put,
	.get = single_get,
	.abort = single_abort,
	.destroy = single_destroy,
};

int dptp_bootstrap_single_create(struct dptp_bootstrap **out, struct dptp_err *err)
{
	struct dptp_bootstrap *b = calloc(1, sizeof(*b));
	if (!b)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	b->ops = &single_ops;
	b->size = b->local_size = b->nnodes = 1;
	gethostname(b->hostname, sizeof(b->hostname) - 1);
	snprintf(b->engine, sizeof(b->engine), "single");
	snprintf(b->job_id, sizeof(b->job_id), "single-%ld", (long)getpid());
	*out = b;
	return 0;
}
