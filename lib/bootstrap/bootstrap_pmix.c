/* Bootstrap over a PMIx server: dptp-run, Open MPI's mpirun (PRRTE),
 * Slurm's srun --mpi=pmix. Fences are non-blocking underneath so that a
 * peer that never arrives becomes -ETIMEDOUT, not a hang. */
#include "bootstrap/bootstrap.h"

#include <errno.h>
#include <pmix.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct pmix_impl {
	pmix_proc_t me;
	bool fence_abandoned; /* a timed-out fence may still complete later */
};

/* Heap state for one fence: on timeout the waiter leaves and the callback,
 * which may still come, frees it. */
struct fence_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	bool abandoned;
	pmix_status_t status;
	/* for gets: a copy of the value, made in the callback */
	void *data;
	size_t len;
	bool typed_ok;
	/* the key a get asks for: PMIx reads it after PMIx_Get_nb returns, and
	 * an abandoned request outlives its caller's stack */
	char key[PMIX_MAX_KEYLEN + 1];
};

static void wait_free(struct fence_wait *w)
{
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w->data);
	free(w);
}

/* Callback side: takes w's lock; false (and w freed) when the waiter gave
 * up on it. */
static bool cb_begin(struct fence_wait *w)
{
	pthread_mutex_lock(&w->lock);
	if (w->abandoned) {
		pthread_mutex_unlock(&w->lock);
		wait_free(w);
		return false;
	}
	return true;
}

static void cb_end(struct fence_wait *w)
{
	w->done = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static void fence_cb(pmix_status_t status, void *cbdata)
{
	struct fence_wait *w = cbdata;
	if (!cb_begin(w))
		return;
	w->status = status;
	cb_end(w);
}

static int get_u32(const pmix_proc_t *p, const char *key, uint32_t *out)
{
	pmix_value_t *v = NULL;
	pmix_info_t info;
	bool t = true;
	PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &t, PMIX_BOOL);
	pmix_status_t rc = PMIx_Get(p, key, &info, 1, &v);
	PMIX_INFO_DESTRUCT(&info);
	if (rc != PMIX_SUCCESS || !v)
		return -ENOENT;
	int ret = 0;
	if (v->type == PMIX_UINT32) *out = v->data.uint32;
	else if (v->type == PMIX_UINT16) *out = v->data.uint16;
	else if (v->type == PMIX_INT) *out = (uint32_t)v->data.integer;
	else if (v->type == PMIX_UINT) *out = v->data.uint;
	else if (v->type == PMIX_PROC_RANK) *out = v->data.rank;
	else if (v->type == PMIX_INT32) *out = (uint32_t)v->data.int32;
	else if (v->type == PMIX_UINT64) *out = (uint32_t)v->data.uint64;
	else if (v->type == PMIX_SIZE) *out = (uint32_t)v->data.size;
	else ret = -EINVAL;
	PMIX_VALUE_RELEASE(v);
	return ret;
}

static int pmix_put(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		    struct dptp_err *err)
{
	pmix_value_t val;
	PMIX_VALUE_CONSTRUCT(&val);
	val.type = PMIX_BYTE_OBJECT;
	val.data.bo.bytes = (char *)data;
	val.data.bo.size = len;
	pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &val);
	if (rc != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "PMIx_Put('%s', %zu bytes) failed (%s)", key, len,
				    PMIx_Error_string(rc));
	return 0;
}

static int pmix_publish(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
			struct dptp_err *err)
{
	DPTP_TRY(pmix_put(b, key, data, len, err));
	pmix_status_t rc = PMIx_Commit();
	if (rc != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "PMIx_Commit failed (%s)", PMIx_Error_string(rc));
	return 0;
}

static struct fence_wait *wait_new(void);
static bool wait_for(struct fence_wait *w, double timeout);

static int pmix_fence(struct dptp_bootstrap *b, double timeout, struct dptp_err *err)
{
	struct pmix_impl *im = b->impl;
	pmix_status_t rc = PMIx_Commit();
	if (rc != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "PMIx_Commit failed (%s)", PMIx_Error_string(rc));
	struct fence_wait *w = wait_new();
	if (!w)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	pmix_proc_t all;
	PMIX_PROC_LOAD(&all, im->me.nspace, PMIX_RANK_WILDCARD);
	pmix_info_t info;
	bool t = true;
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &t, PMIX_BOOL);
	rc = PMIx_Fence_nb(&all, 1, &info, 1, fence_cb, w);
	PMIX_INFO_DESTRUCT(&info);
	if (rc != PMIX_SUCCESS) {
		wait_free(w);
		return dptp_err_set(err, -EIO, "PMIx_Fence_nb failed (%s)", PMIx_Error_string(rc));
	}
	if (!wait_for(w, timeout)) {
		im->fence_abandoned = true;
		return dptp_err_set(err, -ETIMEDOUT,
			"fence over %d ranks did not complete within %.3g s (a peer never arrived)",
			b->size, timeout);
	}
	pmix_status_t st = w->status;
	wait_free(w);
	if (st != PMIX_SUCCESS)
		return dptp_err_set(err, -EIO, "PMIx fence failed (%s)", PMIx_Error_string(st));
	return 0;
}

static void get_cb(pmix_status_t status, pmix_value_t *kv, void *cbdata)
{
	struct fence_wait *w = cbdata;
	if (!cb_begin(w))
		return;
	w->status = status;
	if (status == PMIX_SUCCESS && kv && kv->type == PMIX_BYTE_OBJECT) {
		w->typed_ok = true;
		w->len = kv->data.bo.size;
		w->data = malloc(w->len ? w->len : 1);
		if (w->data && w->len)
			memcpy(w->data, kv->data.bo.bytes, w->len);
		if (!w->data)
			w->status = PMIX_ERR_NOMEM;
	}
	cb_end(w);
}

static struct fence_wait *wait_new(void)
{
	struct fence_wait *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &ca);
	pthread_condattr_destroy(&ca);
	return w;
}

/* Waits for w until timeout; on timeout hands w over to its callback and
 * returns false. Called with w->lock not held. */
static bool wait_for(struct fence_wait *w, double timeout)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout;
	ts.tv_sec = (time_t)end;
	ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
	pthread_mutex_lock(&w->lock);
	int wrc = 0;
	while (!w->done && wrc != ETIMEDOUT)
		wrc = pthread_cond_timedwait(&w->cond, &w->lock, &ts);
	if (!w->done) {
		w->abandoned = true;
		pthread_mutex_unlock(&w->lock);
		return false;
	}
	pthread_mutex_unlock(&w->lock);
	return true;
}

static int pmix_get(struct dptp_bootstrap *b, int rank, const char *key, void **data,
		    size_t *len, double timeout, struct dptp_err *err)
{
	struct pmix_impl *im = b->impl;
	pmix_proc_t p;
	PMIX_PROC_LOAD(&p, im->me.nspace, (pmix_rank_t)rank);
	/* after a collecting fence the data is local with a shared-memory
	 * datastore, or one request away from the server with the hash one
	 * (dptp-run). Non-blocking underneath, so the timeout is ours to the
	 * millisecond (PMIX_TIMEOUT counts whole seconds). */
	struct fence_wait *w = wait_new();
	if (!w)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	snprintf(w->key, sizeof(w->key), "%s", key);
	pmix_status_t rc = PMIx_Get_nb(&p, w->key, NULL, 0, get_cb, w);
	if (rc != PMIX_SUCCESS) {
		wait_free(w);
		if (rc == PMIX_ERR_NOT_FOUND)
			return dptp_err_set(err, -ENOENT, "rank %d published no '%s'", rank, key);
		return dptp_err_set(err, -EIO, "PMIx_Get_nb('%s' of rank %d) failed (%s)", key, rank,
				    PMIx_Error_string(rc));
	}
	if (!wait_for(w, timeout > 0 ? timeout : 0.001)) {
		im->fence_abandoned = true; /* a request is still out: don't finalize */
		return dptp_err_set(err, -ETIMEDOUT, "'%s' of rank %d did not come within %.3g s", key, rank, timeout);
	}
	int ret = 0;
	if (w->status == PMIX_ERR_NOT_FOUND)
		ret = dptp_err_set(err, -ENOENT, "rank %d published no '%s'", rank, key);
	else if (w->status == PMIX_ERR_TIMEOUT)
		ret = dptp_err_set(err, -ETIMEDOUT, "PMIx_Get('%s' of rank %d) timed out", key, rank);
	else if (w->status != PMIX_SUCCESS)
		ret = dptp_err_set(err, -EIO, "PMIx_Get('%s' of rank %d) failed (%s)", key, rank,
				   PMIx_Error_string(w->status));
	else if (!w->typed_ok)
		ret = dptp_err_set(err, -EPROTO, "'%s' of rank %d is not a byte object", key, rank);
	if (ret == 0) {
		*data = w->data;
		*len = w->len;
		w->data = NULL;
	}
	wait_free(w);
	return ret;
}

static void pmix_abort(struct dptp_bootstrap *b, int status, const char *msg)
{
	PMIx_Abort(status, msg, NULL, 0);
}

static void pmix_destroy(struct dptp_bootstrap *b)
{
	struct pmix_impl *im = b->impl;
	if (im && !im->fence_abandoned) {
		/* finalize waits for the server; skip it when a fence is stuck */
		PMIx_Finalize(NULL, 0);
	}
	free(im);
	free(b);
}

static const struct dptp_bootstrap_ops pmix_ops = {
	.name = "pmix",
	.put = pmix_put,
	.fence = pmix_fence,
	.publish = pmix_publish,
	.get = pmix_get,
	.abort = pmix_abort,
	.destroy = pmix_destroy,
};

/* The PMIx server's launcher. dptp-run's workers carry torchrun's
 * TORCHELASTIC_RUN_ID and, since dptp-run gives Open MPI what mpirun does,
 * OMPI_COMM_WORLD_SIZE too: the torchrun variable decides first (neither
 * srun nor mpirun sets it). */
static const char *detect_engine(void)
{
	if (getenv("TORCHELASTIC_RUN_ID"))
		return "dptp-run";
	if (getenv("SLURM_JOB_ID") || getenv("SLURM_STEP_ID"))
		return "srun";
	if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PRTE_LAUNCHED") || getenv("OMPI_MCA_prte_launch"))
		return "mpirun";
	return "pmix";
}

int dptp_bootstrap_pmix_create(struct dptp_bootstrap **out, struct dptp_err *err)
{
	struct dptp_bootstrap *b = calloc(1, sizeof(*b));
	struct pmix_impl *im = calloc(1, sizeof(*im));
	if (!b || !im) {
		free(b);
		free(im);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	pmix_status_t rc = PMIx_Init(&im->me, NULL, 0);
	if (rc != PMIX_SUCCESS) {
		free(b);
		free(im);
		if (rc == PMIX_ERR_UNREACH)
			return dptp_err_set(err, -ECONNREFUSED,
				"PMIx_Init failed (UNREACHABLE): PMIX_NAMESPACE is set but no PMIx server answers; "
				"start under dptp-run, mpirun or srun --mpi=pmix");
		return dptp_err_set(err, -EIO,
			"PMIx_Init failed (%s): not started by a working PMIx launcher; "
			"use dptp-run, mpirun or srun --mpi=pmix", PMIx_Error_string(rc));
	}
	b->ops = &pmix_ops;
	b->impl = im;
	b->rank = (int)im->me.rank;
	pmix_proc_t wild;
	PMIX_PROC_LOAD(&wild, im->me.nspace, PMIX_RANK_WILDCARD);
	uint32_t u;
	if (get_u32(&wild, PMIX_JOB_SIZE, &u) < 0) {
		pmix_destroy(b);
		return dptp_err_set(err, -EIO, "PMIx server did not provide PMIX_JOB_SIZE");
	}
	b->size = (int)u;
	b->local_size = get_u32(&wild, PMIX_LOCAL_SIZE, &u) == 0 ? (int)u : 1;
	b->local_rank = get_u32(&im->me, PMIX_LOCAL_RANK, &u) == 0 ? (int)u : 0;
	b->node = get_u32(&im->me, PMIX_NODEID, &u) == 0 ? (int)u : 0;
	b->nnodes = get_u32(&wild, PMIX_NUM_NODES, &u) == 0 ? (int)u : 1;
	gethostname(b->hostname, sizeof(b->hostname) - 1);
	snprintf(b->engine, sizeof(b->engine), "%s", detect_engine());
	snprintf(b->job_id, sizeof(b->job_id), "%s", im->me.nspace);
	*out = b;
	return 0;
}
