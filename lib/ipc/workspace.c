#include "ipc/workspace.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t opid_draw(const struct dptp_ipc_job *job)
{
	if (job->opid_seeded) {
		/* bug 4: random.randint(0, 2**64-1) from the process-global RNG,
		 * which vLLM seeds with the same seed in every worker */
		uint64_t state = job->seed;
		return dptp_mix64(state);
	}
	uint64_t r = 0;
	if (dptp_entropy(&r, sizeof(r)) < 0)
		r = dptp_mix64((uint64_t)getpid() ^ (uint64_t)(dptp_now() * 1e9));
	return (r & ~(uint64_t)0xffff) | (uint64_t)(job->rank & 0xffff);
}

int dptp_opid_agree(const struct dptp_ipc_job *job, const struct dptp_group *g, int index,
		    uint64_t *opid, struct dptp_err *err)
{
	*opid = index == 0 ? opid_draw(job) : 0;
	return dptp_xchg_bcast_root(job->x, g, 0, opid, sizeof(*opid), err);
}

int dptp_workspace_device(const struct dptp_ipc_job *job)
{
	if (job->device_from_tp_rank)
		return job->tp_rank; /* bug 3: cuda:tp_rank */
	return job->peers[job->rank].device;
}

static int memfd_buffer(size_t bytes, const char *name, int *fd, void **map, struct dptp_err *err)
{
	*fd = memfd_create(name, MFD_CLOEXEC);
	if (*fd < 0)
		return dptp_err_set(err, -errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(*fd, (off_t)bytes) < 0) {
		int e = errno;
		close(*fd);
		*fd = -1;
		return dptp_err_set(err, -e, "ftruncate memfd to %zu bytes: %s", bytes, strerror(e));
	}
	*map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (*map == MAP_FAILED) {
		int e = errno;
		*map = NULL;
		close(*fd);
		*fd = -1;
		return dptp_err_set(err, -e, "mmap memfd: %s", strerror(e));
	}
	return 0;
}

static void lamport_clear(void *buf, size_t bytes, enum dptp_dtype dt)
{
	if (dt == DPTP_DTYPE_FP32) {
		uint32_t *p = buf;
		for (size_t i = 0; i < bytes / 4; i++)
			__atomic_store_n(&p[i], 0x80000000u, __ATOMIC_RELAXED);
	} else {
		uint16_t *p = buf;
		for (size_t i = 0; i < bytes / 2; i++)
			__atomic_store_n(&p[i], (uint16_t)0x8000u, __ATOMIC_RELAXED);
	}
}


int dptp_fd_ring(const struct dptp_ipc_job *job, const struct dptp_group *xg, int rank, int size,
		 struct dptp_ipcsock *socks, int nsocks, const int *my_fds, int **in_fds,
		 struct dptp_err *err)
{
	int rc = 0;
	struct dptp_err e = {0};
	int32_t *sent = calloc((size_t)xg->size, sizeof(int32_t));
	if (!sent)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (int s = 0; s < nsocks; s++)
		for (int j = 0; j < size; j++)
			in_fds[s][j] = -1;
	/* everyone has bound its sockets */
	dptp_err_keep(&rc, err, dptp_xchg_barrier(job->x, xg, &e), &e);
	for (int i = 0; i < size; i++) {
		int to = (rank + i) % size, from = (rank - i + size) % size;
		int32_t ok = 1;
		for (int s = 0; s < nsocks; s++) {
			struct dptp_ipc_msg m = {
				.magic = DPTP_IPC_MAGIC, .global_rank = job->rank,
				.group_rank = rank, .buffer = s, .opid = socks[s].opid,
			};
			int r = socks[s].fd < 0 ? dptp_err_set(&e, -EBADF, "socket '@%s' is not bound", socks[s].name)
						: dptp_ipcsock_send(&socks[s], to, my_fds[s], &m, &e);
			if (r < 0) {
				ok = 0;
				dptp_err_prefix(&e, "sending to group rank %d", to);
				dptp_err_keep(&rc, err, r, &e);
			}
		}
		/* a datagram is queued at its receiver when sendmsg returns: after
		 * this round everything that was sent can be read without waiting */
		int r = dptp_xchg_allgather(job->x, xg, &ok, sizeof(ok), sent, &e);
		dptp_err_keep(&rc, err, r, &e);
		if (r < 0)
			continue;
		int want = xg->ranks[from < xg->size ? from : 0]; /* who the caller believes `from` is */
		for (int s = 0; s < nsocks; s++) {
			if (socks[s].fd < 0)
				continue;
			struct dptp_ipc_msg m;
			pid_t pid;
			uid_t uid;
			int fd;
			r = dptp_ipcsock_recv(&socks[s], &fd, &m, &pid, &uid, 0, &e);
			if (r == -EAGAIN) {
				if (sent[from]) /* someone else took the datagram meant for us */
					dptp_err_keep(&rc, err, dptp_err_set(&e, -ENOENT,
						"buffer %d: group rank %d (global rank %d) sent its descriptor to '@%s', "
						"but it never arrived here: another process holds that name",
						s, from, want, socks[s].name), &e);
				continue;
			}
			if (r < 0) {
				dptp_err_keep(&rc, err, r, &e);
				continue;
			}
			bool good = m.global_rank == want && m.buffer == s && uid == getuid() &&
				    want >= 0 && want < job->world && pid == job->peers[want].pid;
			if (!good) {
				int g = m.global_rank >= 0 && m.global_rank < job->world ? m.global_rank : -1;
				dptp_err_keep(&rc, err, dptp_err_set(&e, -EXDEV,
					"buffer %d: '@%s' received a descriptor from global rank %d (pid %ld, group rank %d, "
					"TP group of rank %d) where group rank %d = global rank %d (pid %ld) was expected: "
					"a descriptor crossed groups",
					s, socks[s].name, m.global_rank, (long)pid, m.group_rank, g, from, want,
					(long)job->peers[want].pid), &e);
				close(fd);
				continue;
			}
			in_fds[s][from] = fd;
		}
	}
	/* descriptors that came from elsewhere */
	dptp_err_keep(&rc, err, dptp_xchg_barrier(job->x, xg, &e), &e);
	for (int s = 0; s < nsocks; s++) {
		if (socks[s].fd < 0)
			continue;
		struct dptp_ipc_msg m;
		pid_t pid;
		uid_t uid;
		int fd;
		while (dptp_ipcsock_recv(&socks[s], &fd, &m, &pid, &uid, 0, &e) != -EAGAIN) {
			if (fd >= 0)
				close(fd);
			dptp_err_keep(&rc, err, dptp_err_set(&e, -EXDEV,
				"buffer %d: '@%s' received an extra descriptor from global rank %d (pid %ld): "
				"two groups share this socket name", s, socks[s].name, m.global_rank, (long)pid), &e);
		}
	}
	free(sent);
	return rc;
}

int dptp_workspace_create(struct dptp_workspace *ws, const struct dptp_ipc_job *job,
			  const struct dptp_group *xg, int rank, int size, size_t slot_bytes,
			  enum dptp_dtype dt, struct dptp_err *err)
{
	memset(ws, 0, sizeof(*ws));
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		ws->fds[b] = -1;
		ws->socks[b].fd = -1;
	}
	ws->rank = rank;
	ws->size = size;
	ws->xg = xg;
	ws->dt = dt;
	ws->slot_bytes = slot_bytes;
	ws->buf_bytes = slot_bytes * (size_t)size;
	int rc = 0;
	struct dptp_err e = {0};

	/* the root draws the opId and broadcasts it in the exchange group */
	uint64_t opid;
	dptp_err_keep(&rc, err, dptp_opid_agree(job, xg, rank, &opid, &e), &e);
	if (rc < 0)
		dptp_err_prefix(err, "opId broadcast");
	ws->opid = opid;

	int *in_store = malloc(sizeof(int) * (size_t)size * DPTP_WS_NBUF);
	int *in[DPTP_WS_NBUF];
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		ws->peer[b] = calloc((size_t)size, sizeof(void *));
		in[b] = in_store ? in_store + (size_t)b * size : NULL;
		if (!ws->peer[b] || !in_store) {
			free(in_store);
			dptp_workspace_release(ws);
			return dptp_err_set(err, -ENOMEM, "out of memory");
		}
	}
	for (int b = 0; rc == 0 && b < DPTP_WS_NBUF; b++) {
		char nm[32];
		snprintf(nm, sizeof(nm), "dptp-ws%d", b);
		dptp_err_keep(&rc, err, memfd_buffer(ws->buf_bytes, nm, &ws->fds[b], &ws->local[b], &e), &e);
		if (rc == 0)
			lamport_clear(ws->local[b], ws->buf_bytes, dt);
	}
	/* three sockets, each under its own name, as the reference has */
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		int r = dptp_ipcsock_bind(&ws->socks[b], rank, opid + (uint64_t)b, &e);
		if (r < 0)
			dptp_err_prefix(&e, "global rank %d (group rank %d of %d)", job->rank, rank, size);
		dptp_err_keep(&rc, err, r, &e);
	}
	dptp_err_keep(&rc, err, dptp_fd_ring(job, xg, rank, size, ws->socks, DPTP_WS_NBUF, ws->fds, in, &e), &e);
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		for (int j = 0; j < size; j++) {
			if (j == rank) {
				ws->peer[b][j] = ws->local[b];
				if (in[b][j] >= 0)
					close(in[b][j]);
				continue;
			}
			if (in[b][j] < 0) {
				if (rc == 0)
					rc = dptp_err_set(err, -ENOENT, "buffer %d: no descriptor from group rank %d", b, j);
				continue;
			}
			void *p = mmap(NULL, ws->buf_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, in[b][j], 0);
			close(in[b][j]);
			if (p == MAP_FAILED) {
				dptp_err_keep(&rc, err, dptp_err_set(&e, -errno, "mmap of group rank %d's buffer %d: %s",
							    j, b, strerror(errno)), &e);
				continue;
			}
			ws->peer[b][j] = p;
		}
	}
	free(in_store);
	if (rc < 0)
		dptp_workspace_release(ws);
	return rc;
}

void dptp_workspace_release(struct dptp_workspace *ws)
{
	if (!ws || ws->buf_bytes == 0) /* NULL, zeroed or already released */
		return;
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		if (ws->peer[b]) {
			for (int j = 0; j < ws->size; j++)
				if (ws->peer[b][j] && ws->peer[b][j] != ws->local[b])
					munmap(ws->peer[b][j], ws->buf_bytes);
			free(ws->peer[b]);
			ws->peer[b] = NULL;
		}
		if (ws->local[b])
			munmap(ws->local[b], ws->buf_bytes);
		ws->local[b] = NULL;
		if (ws->fds[b] >= 0)
			close(ws->fds[b]);
		ws->fds[b] = -1;
		dptp_ipcsock_close(&ws->socks[b]);
	}
	ws->buf_bytes = 0;
}

/* Index of the first element still -0.0 ("not written") at or after i, or n. */
static size_t first_neg_zero(const void *p, size_t i, size_t n, enum dptp_dtype dt)
{
	if (dt == DPTP_DTYPE_FP32) {
		const uint32_t *q = p;
		while (i < n && __atomic_load_n(&q[i], __ATOMIC_RELAXED) != 0x80000000u)
			i++;
	} else {
		const uint16_t *q = p;
		while (i < n && __atomic_load_n(&q[i], __ATOMIC_RELAXED) != 0x8000u)
			i++;
	}
	return i;
}

void dptp_residual_rmsnorm_ref(const float *sum, const void *residual_in, const void *gamma,
			       void *residual_out, void *norm_out, int tokens, int hidden,
			       float eps, enum dptp_dtype dt)
{
	for (int t = 0; t < tokens; t++) {
		size_t base = (size_t)t * (size_t)hidden;
		float ss = 0.0f;
		for (int h = 0; h < hidden; h++) {
			float r = sum[base + h] + dptp_load_elt(residual_in, base + h, dt);
			dptp_store_elt(residual_out, base + h, r, dt);
			float rr = dptp_load_elt(residual_out, base + h, dt);
			ss += rr * rr;
		}
		float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
		for (int h = 0; h < hidden; h++) {
			float rr = dptp_load_elt(residual_out, base + h, dt);
			dptp_store_elt(norm_out, base + h, rr * inv * dptp_load_elt(gamma, (size_t)h, dt), dt);
		}
	}
}

int dptp_workspace_fused_allreduce(struct dptp_workspace *ws, const void *x,
				   const void *residual_in, const void *gamma,
				   void *residual_out, void *norm_out, int tokens, int hidden,
				   float eps, double deadline, struct dptp_err *err)
{
	enum dptp_dtype dt = ws->dt;
	size_t n = (size_t)tokens * (size_t)hidden, esz = dptp_dtype_bytes(dt);
	if (n * esz > ws->slot_bytes)
		return dptp_err_set(err, -E2BIG, "%zu bytes exceed the workspace slot of %zu", n * esz, ws->slot_bytes);
	unsigned b = ws->calls % DPTP_WS_NBUF;
	/* push: my input into my slot of every peer's buffer b; -0.0 is the
	 * "not yet written" mark, so a real -0.0 becomes +0.0 */
	for (int j = 0; j < ws->size; j++) {
		char *dst = (char *)ws->peer[b][j] + (size_t)ws->rank * ws->slot_bytes;
		if (dt == DPTP_DTYPE_FP32) {
			const uint32_t *src = x;
			for (size_t i = 0; i < n; i++) {
				uint32_t v = src[i] == 0x80000000u ? 0 : src[i];
				__atomic_store_n(&((uint32_t *)dst)[i], v, __ATOMIC_RELAXED);
			}
		} else {
			const uint16_t *src = x;
			for (size_t i = 0; i < n; i++) {
				uint16_t v = src[i] == 0x8000u ? 0 : src[i];
				__atomic_store_n(&((uint16_t *)dst)[i], v, __ATOMIC_RELAXED);
			}
		}
	}
	__atomic_thread_fence(__ATOMIC_RELEASE);
	/* pull: wait until no -0.0 remains in any peer's slot of my buffer b */
	const char *mine = ws->local[b];
	for (int j = 0; j < ws->size; j++) {
		const char *slot = mine + (size_t)j * ws->slot_bytes;
		size_t i = 0;
		unsigned spins = 0;
		while (i < n) {
			i = first_neg_zero(slot, i, n, dt);
			if (i == n)
				break;
			/* spin briefly, then sleep: on an oversubscribed host the
			 * peer we wait for needs this CPU */
			if (++spins > 64) {
				struct timespec ts = { 0, spins > 1024 ? 50000 : 10000 };
				nanosleep(&ts, NULL);
			} else {
				sched_yield();
			}
			if ((spins & 15) == 0) {
				if (dptp_now() > deadline)
					return dptp_err_set(err, -ETIMEDOUT,
						"Lamport buffer %u: still waiting for group rank %d (global rank %d): "
						"element %zu of %zu not written",
						b, j, ws->xg->ranks[j < ws->xg->size ? j : 0], i, n);
			}
		}
	}
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	float *sum = malloc(n * sizeof(float));
	if (!sum)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		float s = 0.0f;
		for (int j = 0; j < ws->size; j++)
			s += dptp_load_elt(mine + (size_t)j * ws->slot_bytes, i, dt);
		sum[i] = s;
	}
	dptp_residual_rmsnorm_ref(sum, residual_in, gamma, residual_out, norm_out, tokens, hidden, eps, dt);
	free(sum);
	/* the previous call's buffer is now safe to clear: every peer has
	 * finished writing it, and only this rank reads it */
	lamport_clear(ws->local[(b + DPTP_WS_NBUF - 1) % DPTP_WS_NBUF], ws->buf_bytes, dt);
	ws->calls++;
	return 0;
}

static int host_create(void **out, const struct dptp_ipc_job *job, const struct dptp_group *xg, int rank,
		       int size, size_t max_bytes, enum dptp_dtype dt, struct dptp_err *err)
{
	struct dptp_workspace *ws = calloc(1, sizeof(*ws));
	if (!ws)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc = dptp_workspace_create(ws, job, xg, rank, size, max_bytes, dt, err);
	if (rc < 0) {
		free(ws);
		return rc;
	}
	*out = ws;
	return 0;
}

static int host_fused(void *ws, const void *x, const void *residual_in, const void *gamma, void *residual_out,
		      void *norm_out, int tokens, int hidden, float eps, double deadline, const char **algo,
		      struct dptp_err *err)
{
	if (algo)
		*algo = "one-shot (Lamport)";
	return dptp_workspace_fused_allreduce(ws, x, residual_in, gamma, residual_out, norm_out, tokens, hidden,
					      eps, deadline, err);
}

static void host_destroy(void *ws)
{
	dptp_workspace_release(ws);
	free(ws);
}

const struct dptp_ws_ops dptp_ws_host_ops = {
	.name = "host",
	.place = "",
	.create = host_create,
	.fused = host_fused,
	.destroy = host_destroy,
};
