/* NCCL data plane: a world communicator from a unique id shared over the
 * bootstrap, group communicators from ncclCommSplit, collectives on device
 * buffers. Communicators are non-blocking: every wait polls
 * ncclCommGetAsyncError against the exchange deadline and aborts the
 * communicator when it passes, so a stuck peer is a timeout, not a hang. */
#include "dptp-config.h"

#if DPTP_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plane/comm.h"
#include "plane/comm_nccl.h"

/* libnccl is opened when a rank first needs it, not at start-up: loading
 * and relocating its 200 MB cost every dptp-check process 3-4 ms of CPU,
 * host backend or not. Each entry point has the header's own type. */
#define NCCL_FNS(X) X(GetUniqueId) X(CommInitRankConfig) X(CommSplit) X(CommGetAsyncError) \
	X(CommAbort) X(CommDestroy) X(AllReduce) X(Broadcast) X(AllGather) X(GetErrorString) X(GetLastError)
static struct {
#define X(f) __typeof__(nccl##f) *f;
	NCCL_FNS(X)
#undef X
} N;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static char nccl_why[512];

static void nccl_open(void)
{
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!h) /* where this build found it */
		h = dlopen(DPTP_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(nccl_why, sizeof(nccl_why), "cannot load libnccl.so.2: %s", dlerror());
		return;
	}
#define X(f) \
	if (!(N.f = (__typeof__(nccl##f) *)dlsym(h, "nccl" #f)) && !*nccl_why) \
		snprintf(nccl_why, sizeof(nccl_why), "libnccl.so.2 has no nccl%s", #f);
	NCCL_FNS(X)
#undef X
}

/* 0 when NCCL is usable in this process, or -ENOSYS with err set. */
static int nccl_load(struct dptp_err *err)
{
	pthread_once(&nccl_once, nccl_open);
	return *nccl_why ? dptp_err_set(err, -ENOSYS, "%s", nccl_why) : 0;
}

#define ncclGetUniqueId N.GetUniqueId
#define ncclCommInitRankConfig N.CommInitRankConfig
#define ncclCommSplit N.CommSplit
#define ncclCommGetAsyncError N.CommGetAsyncError
#define ncclCommAbort N.CommAbort
#define ncclCommDestroy N.CommDestroy
#define ncclAllReduce N.AllReduce
#define ncclBroadcast N.Broadcast
#define ncclAllGather N.AllGather
#define ncclGetErrorString N.GetErrorString
#define ncclGetLastError N.GetLastError

enum { G_WORLD, G_TP, G_PP, G_DP, G_EP, G_N };

struct nccl_impl {
	int device;
	int rank;
	ncclComm_t comm[G_N];
	cudaStream_t stream;
	bool aborted;
};

static int slot_of(enum dptp_group_kind k)
{
	switch (k) {
	case DPTP_GROUP_WORLD: return G_WORLD;
	case DPTP_GROUP_TP: return G_TP;
	case DPTP_GROUP_PP: return G_PP;
	case DPTP_GROUP_DP: return G_DP;
	case DPTP_GROUP_EP: return G_EP;
	}
	return G_WORLD;
}

static int nccl_err(struct dptp_err *err, ncclComm_t comm, ncclResult_t r, const char *what)
{
	const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
	return dptp_err_set(err, r == ncclInvalidUsage || r == ncclInvalidArgument ? -EINVAL : -EIO,
			    "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

/* Waits until comm has no operation in progress, or the deadline. */
static int wait_comm(struct nccl_impl *im, ncclComm_t comm, double deadline, const char *what,
		     struct dptp_err *err)
{
	for (unsigned spins = 0;; spins++) {
		ncclResult_t st = ncclSuccess;
		ncclResult_t r = ncclCommGetAsyncError(comm, &st);
		if (r != ncclSuccess)
			return nccl_err(err, comm, r, what);
		if (st == ncclSuccess)
			return 0;
		if (st != ncclInProgress)
			return nccl_err(err, comm, st, what);
		if (dptp_now() > deadline) {
			ncclCommAbort(comm);
			im->aborted = true;
			return dptp_err_set(err, -ETIMEDOUT, "%s: no progress before the deadline; communicator aborted", what);
		}
		if (spins > 100) {
			struct timespec ts = { 0, 20000 };
			nanosleep(&ts, NULL);
		}
	}
}

static int wait_stream(struct nccl_impl *im, ncclComm_t comm, double deadline, const char *what,
		       struct dptp_err *err)
{
	DPTP_TRY(wait_comm(im, comm, deadline, what, err));
	for (unsigned spins = 0;; spins++) {
		cudaError_t e = cudaStreamQuery(im->stream);
		if (e == cudaSuccess)
			return 0;
		if (e != cudaErrorNotReady)
			return dptp_err_set(err, -EIO, "%s: %s", what, cudaGetErrorString(e));
		ncclResult_t st = ncclSuccess;
		ncclCommGetAsyncError(comm, &st);
		if (st != ncclSuccess && st != ncclInProgress)
			return nccl_err(err, comm, st, what);
		if (dptp_now() > deadline) {
			ncclCommAbort(comm);
			im->aborted = true;
			return dptp_err_set(err, -ETIMEDOUT, "%s: a peer never arrived; communicator aborted", what);
		}
		if (spins > 100) {
			struct timespec ts = { 0, 20000 };
			nanosleep(&ts, NULL);
		}
	}
}

static ncclComm_t comm_for(struct dptp_comm *c, const struct dptp_group *g, struct dptp_err *err)
{
	struct nccl_impl *im = c->impl;
	ncclComm_t comm = im->comm[slot_of(g->kind)];
	if (!comm)
		dptp_err_set(err, -EINVAL, "no NCCL communicator for the %s group", dptp_group_kind_name(g->kind));
	return comm;
}

static ncclDataType_t nccl_type(enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_BF16: return ncclBfloat16;
	case DPTP_DTYPE_FP16: return ncclFloat16;
	case DPTP_DTYPE_FP32: return ncclFloat32;
	}
	return ncclFloat32;
}

static int nccl_bcast(struct dptp_comm *c, const struct dptp_group *g, void *buf, size_t bytes,
		      int root, struct dptp_err *err)
{
	struct nccl_impl *im = c->impl;
	ncclComm_t comm = comm_for(c, g, err);
	if (!comm)
		return -EINVAL;
	if (root < 0 || root >= g->size) {
		char s[256];
		dptp_group_format(g, s, sizeof(s));
		return dptp_err_set(err, -EINVAL, "root %d is out of range for group %s", root, s);
	}
	cudaSetDevice(im->device);
	ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclChar, root, comm, im->stream);
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_err(err, comm, r, "ncclBroadcast");
	return wait_stream(im, comm, c->x->deadline, "ncclBroadcast", err);
}

static int nccl_allgather(struct dptp_comm *c, const struct dptp_group *g, const void *send,
			  void *recv, size_t bytes, struct dptp_err *err)
{
	struct nccl_impl *im = c->impl;
	ncclComm_t comm = comm_for(c, g, err);
	if (!comm)
		return -EINVAL;
	cudaSetDevice(im->device);
	ncclResult_t r = ncclAllGather(send, recv, bytes, ncclChar, comm, im->stream);
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_err(err, comm, r, "ncclAllGather");
	return wait_stream(im, comm, c->x->deadline, "ncclAllGather", err);
}

static int nccl_allreduce(struct dptp_comm *c, const struct dptp_group *g, void *buf,
			  size_t count, enum dptp_dtype dt, struct dptp_err *err)
{
	struct nccl_impl *im = c->impl;
	ncclComm_t comm = comm_for(c, g, err);
	if (!comm)
		return -EINVAL;
	cudaSetDevice(im->device);
	ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, comm, im->stream);
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_err(err, comm, r, "ncclAllReduce");
	return wait_stream(im, comm, c->x->deadline, "ncclAllReduce", err);
}

static void *nccl_alloc(struct dptp_comm *c, size_t bytes)
{
	struct nccl_impl *im = c->impl;
	void *p = NULL;
	cudaSetDevice(im->device);
	return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void nccl_free(struct dptp_comm *c, void *p)
{
	if (p)
		cudaFree(p);
}

static int nccl_upload(struct dptp_comm *c, void *dst, const void *host, size_t bytes)
{
	struct nccl_impl *im = c->impl;
	cudaSetDevice(im->device);
	return cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -EIO;
}

static int nccl_download(struct dptp_comm *c, void *host, const void *src, size_t bytes)
{
	struct nccl_impl *im = c->impl;
	cudaSetDevice(im->device);
	return cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -EIO;
}

static void nccl_destroy(struct dptp_comm *c)
{
	if (!c)
		return;
	struct nccl_impl *im = c->impl;
	if (im) {
		for (int i = G_N - 1; i >= 0; i--) {
			if (!im->comm[i] || (i != G_WORLD && im->comm[i] == im->comm[G_WORLD]))
				continue;
			if (im->aborted)
				ncclCommAbort(im->comm[i]);
			else
				ncclCommDestroy(im->comm[i]);
		}
		if (im->stream)
			cudaStreamDestroy(im->stream);
		free(im);
	}
	free(c);
}

static const struct dptp_comm_ops nccl_ops = {
	.name = "nccl",
	.bcast = nccl_bcast,
	.allgather = nccl_allgather,
	.allreduce = nccl_allreduce,
	.alloc = nccl_alloc,
	.free = nccl_free,
	.upload = nccl_upload,
	.download = nccl_download,
	.destroy = nccl_destroy,
};

int dptp_comm_nccl_create(struct dptp_comm **out, struct dptp_exchange *x, int device,
			  const struct dptp_group *const *groups, int ngroups, struct dptp_err *err)
{
	struct dptp_comm *c = calloc(1, sizeof(*c));
	struct nccl_impl *im = calloc(1, sizeof(*im));
	if (!c || !im) {
		free(c);
		free(im);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	c->ops = &nccl_ops;
	c->x = x;
	c->impl = im;
	im->device = device;
	im->rank = x->b->rank;
	int rc = nccl_load(err);
	cudaError_t ce = rc < 0 ? cudaSuccess : cudaSetDevice(device);
	if (ce == cudaSuccess)
		ce = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking);
	if (rc == 0 && ce != cudaSuccess)
		rc = dptp_err_set(err, -EIO, "device %d: %s", device, cudaGetErrorString(ce));

	/* the world communicator: rank 0's unique id over the bootstrap */
	ncclUniqueId id;
	memset(&id, 0, sizeof(id));
	if (rc == 0 && im->rank == 0) {
		ncclResult_t r = ncclGetUniqueId(&id);
		if (r != ncclSuccess)
			rc = nccl_err(err, NULL, r, "ncclGetUniqueId");
	}
	struct dptp_group world = { .kind = DPTP_GROUP_WORLD, .size = x->b->size, .index = im->rank };
	world.ranks = calloc((size_t)world.size, sizeof(int));
	for (int i = 0; world.ranks && i < world.size; i++)
		world.ranks[i] = i;
	struct dptp_err e2 = {0};
	int brc = world.ranks ? dptp_xchg_bcast(x, &world, 0, &id, sizeof(id), &e2) : -ENOMEM;
	free(world.ranks);
	if (rc == 0 && brc < 0) {
		rc = brc;
		if (err)
			*err = e2;
	}
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	if (rc == 0) {
		ncclResult_t r = ncclCommInitRankConfig(&im->comm[G_WORLD], x->b->size, id, im->rank, &cfg);
		if (r != ncclSuccess && r != ncclInProgress)
			rc = nccl_err(err, im->comm[G_WORLD], r, "ncclCommInitRankConfig");
		else
			rc = wait_comm(im, im->comm[G_WORLD], x->deadline, "ncclCommInitRankConfig", err);
	}
	/* one split per group kind, in the same order on every rank; color =
	 * the group's first member, key = the index in it */
	for (int i = 0; rc == 0 && i < ngroups; i++) {
		const struct dptp_group *g = groups[i];
		int s = slot_of(g->kind);
		if (s == G_WORLD)
			continue;
		if (g->size == x->b->size) {
			/* the group is the world (every group at world 1): share the
			 * world communicator rather than split it */
			im->comm[s] = im->comm[G_WORLD];
			continue;
		}
		ncclResult_t r = ncclCommSplit(im->comm[G_WORLD], g->ranks[0], g->index, &im->comm[s], &cfg);
		if (r != ncclSuccess && r != ncclInProgress)
			rc = nccl_err(err, im->comm[G_WORLD], r, "ncclCommSplit");
		else
			rc = wait_comm(im, im->comm[s], x->deadline, "ncclCommSplit", err);
	}
	if (rc < 0) {
		im->aborted = true;
		nccl_destroy(c);
		return rc;
	}
	*out = c;
	return 0;
}

int dptp_comm_is_nccl(const struct dptp_comm *c)
{
	return c && c->ops == &nccl_ops;
}

int dptp_comm_nccl_allreduce_on(struct dptp_comm *c, const struct dptp_group *g, void *buf,
				size_t count, enum dptp_dtype dt, void *stream, struct dptp_err *err)
{
	if (!dptp_comm_is_nccl(c))
		return dptp_err_set(err, -ENOTSUP, "the data plane is not NCCL");
	ncclComm_t comm = comm_for(c, g, err);
	if (!comm)
		return -EINVAL;
	ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, comm, (cudaStream_t)stream);
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_err(err, comm, r, "ncclAllReduce");
	return 0;
}

int dptp_nccl_probe(int nranks, int rank, struct dptp_exchange *x, const struct dptp_group *g,
		    struct dptp_err *err)
{
	/* a communicator on whatever device is current, as NCCL users create
	 * them: two ranks on one GPU give "Duplicate GPU detected" */
	ncclUniqueId id;
	memset(&id, 0, sizeof(id));
	int rc = nccl_load(err); /* the broadcast below runs anyway (lockstep) */
	if (rc == 0 && g->index == 0 && ncclGetUniqueId(&id) != ncclSuccess)
		rc = dptp_err_set(err, -EIO, "ncclGetUniqueId failed");
	struct dptp_err e2 = {0};
	int brc = dptp_xchg_bcast(x, g, g->ranks[0], &id, sizeof(id), &e2);
	if (rc < 0)
		return rc;
	if (brc < 0) {
		if (err)
			*err = e2;
		return brc;
	}
	ncclComm_t comm = NULL;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	cfg.blocking = 0;
	struct nccl_impl im = {0};
	ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress)
		rc = nccl_err(err, comm, r, "ncclCommInitRank");
	else
		rc = wait_comm(&im, comm, x->deadline, "ncclCommInitRank", err);
	if (comm) {
		if (rc < 0 || im.aborted)
			ncclCommAbort(comm);
		else
			ncclCommDestroy(comm);
	}
	return rc;
}

#else /* no NCCL in this build: no data plane is NCCL */

#include "plane/comm_nccl.h"

int dptp_comm_is_nccl(const struct dptp_comm *c)
{
	return 0;
}

#endif
