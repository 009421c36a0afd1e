#include "ipc/workspace.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <sys/syscall.h>

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

/* A slot element is stored with its sign bit flipped: a fresh memfd page
 * (all zero bits) then reads as -0.0, "not written", with no fill at
 * create, and clearing is a memset. What is stored is the value with -0.0
 * made +0.0, so a written element never reads as -0.0: the Lamport
 * protocol exactly, in another encoding of the same bits. */
#define FLIP16 0x8000u
#define FLIP32 0x80000000u

/* The data of the buffers moves with pwrite and pread on their memfds
 * (dptp_fd_io), not through the mappings, which only the futex words use. */
static int buf_io(int fd, bool wr, void *p, size_t bytes, size_t off, int j, unsigned b, struct dptp_err *err)
{
	int rc = dptp_fd_io(fd, wr, p, bytes, off);
	return rc < 0 ? dptp_err_set(err, rc, "%s group rank %d's buffer %u at byte %zu: %s", wr ? "writing" : "reading",
				     j, b, off, strerror(-rc)) : 0;
}

/* Marks bytes at off of buffer fd "not written" again (zero bits): the
 * pages go back (a hole reads as zeros), or are written over with zeros
 * where holes are refused. No peer writes this buffer before the call
 * after next. */
static int lamport_clear(int fd, size_t off, size_t bytes, unsigned b, struct dptp_err *err)
{
	static const char zeros[65536];
	if (!bytes || fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)bytes) == 0)
		return 0;
	for (size_t done = 0; done < bytes; done += sizeof(zeros)) {
		size_t k = bytes - done < sizeof(zeros) ? bytes - done : sizeof(zeros);
		DPTP_TRY(buf_io(fd, true, (void *)zeros, k, off + done, -1, b, err));
	}
	return 0;
}

/* The futex words after the data of every buffer: posted[j] counts the
 * slots group rank j has pushed into this buffer. A reader sleeps on the
 * word of the writer it waits for instead of spinning: on an
 * oversubscribed host that writer needs the CPU. The data (no -0.0 left)
 * stays what decides that a slot has arrived; the word only wakes. */
static uint32_t *posted(void *buf, size_t buf_bytes)
{
	return (uint32_t *)((char *)buf + buf_bytes);
}

static size_t mapped_bytes(size_t buf_bytes, int size)
{
	return buf_bytes + ((size_t)size * sizeof(uint32_t) + 63) / 64 * 64;
}

static void futex_wake_all(uint32_t *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *w == seen, at most until `deadline`, and at most 20 ms. */
static void futex_wait_until(uint32_t *w, uint32_t seen, double deadline)
{
	double left = deadline - dptp_now();
	if (left <= 0)
		return;
	if (left > 0.02)
		left = 0.02;
	struct timespec ts = { 0, (long)(left * 1e9) };
	syscall(SYS_futex, w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static bool in_job(const void *ctx, pid_t pid, uid_t uid)
{
	const struct dptp_ipc_job *job = ctx;
	if (uid != getuid())
		return false;
	for (int r = 0; r < job->world; r++)
		if (job->peers[r].pid == pid && job->peers[r].host == job->peers[job->rank].host)
			return true;
	return false;
}

int dptp_ipc_bind(const struct dptp_ipc_job *job, struct dptp_ipcsock *s, int group_rank, uint64_t opid,
		  struct dptp_err *err)
{
	int rc = dptp_ipcsock_bind(s, group_rank, opid, err);
	pid_t pid;
	uid_t uid;
	if (rc != -EADDRINUSE || dptp_ipcsock_holder(s->name, &pid, &uid) < 0)
		return rc;
	for (int r = 0; r < job->world; r++)
		if (job->peers[r].pid == pid && job->peers[r].host == job->peers[job->rank].host)
			return dptp_err_set(err, -EADDRINUSE, "bind '@%s': held by global rank %d (pid %ld) of this job",
					    s->name, r, (long)pid);
	return dptp_err_set(err, -ENOTUNIQ,
		"bind '@%s': squatted by pid %ld (uid %ld), a process outside the job", s->name, (long)pid,
		uid == (uid_t)-1 ? -1L : (long)uid);
}

/* Drains the ring's sockets while the caller sends or waits in the exchange. */
struct drainer {
	struct dptp_ipcsock *socks;
	int n;
	int stop;
	int wake; /* eventfd: stop is set, leave the poll now */
	pthread_t th;
	bool running;
};

static void *drain_main(void *arg)
{
	struct drainer *d = arg;
	struct pollfd p[DPTP_WS_NBUF + 1];
	int n = d->n < DPTP_WS_NBUF ? d->n : DPTP_WS_NBUF;
	while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
		for (int i = 0; i < n; i++)
			p[i] = (struct pollfd){ .fd = d->socks[i].fd, .events = POLLIN };
		p[n] = (struct pollfd){ .fd = d->wake, .events = POLLIN };
		/* woken by the stop's eventfd; the timeout only bounds a
		 * missed wake (no eventfd) */
		if (poll(p, (nfds_t)n + 1, 20) <= 0)
			continue;
		int full = 0;
		for (int i = 0; i < n; i++) {
			if (p[i].revents & POLLIN)
				dptp_ipcsock_pump(&d->socks[i]);
			full += __atomic_load_n(&d->socks[i].nstash, __ATOMIC_RELAXED) >= DPTP_IPC_STASH;
		}
		if (full) { /* the job's own datagrams wait for the caller */
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
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
	for (int s = 0; s < nsocks; s++) {
		for (int j = 0; j < size; j++)
			in_fds[s][j] = -1;
		socks[s].admit = in_job;
		socks[s].admit_ctx = job;
		socks[s].foreign = job->foreign;
	}
	struct drainer dr = { .socks = socks, .n = nsocks, .wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) };
	dr.running = pthread_create(&dr.th, NULL, drain_main, &dr) == 0;
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
						: dptp_ipcsock_send(&socks[s], to, my_fds[s], &m, job->x->deadline, &e);
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
	if (dr.running) {
		uint64_t one = 1;
		__atomic_store_n(&dr.stop, 1, __ATOMIC_RELEASE);
		if (dr.wake >= 0 && write(dr.wake, &one, sizeof(one)) < 0)
			(void)0; /* the poll's timeout ends it then */
		pthread_join(dr.th, NULL);
	}
	if (dr.wake >= 0)
		close(dr.wake);
	for (int s = 0; s < nsocks; s++)
		socks[s].admit = NULL; /* the job table is borrowed for the ring only */
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
		ws->peer_fd[b] = malloc((size_t)size * sizeof(int));
		for (int j = 0; ws->peer_fd[b] && j < size; j++)
			ws->peer_fd[b][j] = -1;
		in[b] = in_store ? in_store + (size_t)b * size : NULL;
		if (!ws->peer[b] || !ws->peer_fd[b] || !in_store) {
			free(in_store);
			dptp_workspace_release(ws);
			return dptp_err_set(err, -ENOMEM, "out of memory");
		}
	}
	for (int b = 0; rc == 0 && b < DPTP_WS_NBUF; b++) {
		char nm[32];
		snprintf(nm, sizeof(nm), "dptp-ws%d", b);
		dptp_err_keep(&rc, err, memfd_buffer(mapped_bytes(ws->buf_bytes, size), nm, &ws->fds[b],
						     &ws->local[b], &e), &e);
		/* a fresh memfd is all "not written" (see FLIP16) */
		ws->used[b] = 0;
	}
	/* three sockets, each under its own name, as the reference has */
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		int r = dptp_ipc_bind(job, &ws->socks[b], rank, opid + (uint64_t)b, &e);
		if (r < 0)
			dptp_err_prefix(&e, "global rank %d (group rank %d of %d)", job->rank, rank, size);
		dptp_err_keep(&rc, err, r, &e);
	}
	dptp_err_keep(&rc, err, dptp_fd_ring(job, xg, rank, size, ws->socks, DPTP_WS_NBUF, ws->fds, in, &e), &e);
	for (int b = 0; b < DPTP_WS_NBUF; b++) {
		for (int j = 0; j < size; j++) {
			if (j == rank) {
				ws->peer[b][j] = ws->local[b];
				ws->peer_fd[b][j] = ws->fds[b];
				if (in[b][j] >= 0)
					close(in[b][j]);
				continue;
			}
			if (in[b][j] < 0) {
				if (rc == 0)
					rc = dptp_err_set(err, -ENOENT, "buffer %d: no descriptor from group rank %d", b, j);
				continue;
			}
			void *p = mmap(NULL, mapped_bytes(ws->buf_bytes, size), PROT_READ | PROT_WRITE, MAP_SHARED,
				       in[b][j], 0);
			ws->peer_fd[b][j] = in[b][j]; /* the data goes through it */
			if (p == MAP_FAILED) {
				dptp_err_keep(&rc, err, dptp_err_set(&e, -errno, "mmap of group rank %d's buffer %d: %s",
							    j, b, strerror(errno)), &e);
				continue;
			}
			ws->peer[b][j] = p;
		}
	}
	free(in_store);
	if (rc == 0 && !(ws->after = calloc((size_t)size, sizeof(bool))))
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
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
					munmap(ws->peer[b][j], mapped_bytes(ws->buf_bytes, ws->size));
			free(ws->peer[b]);
			ws->peer[b] = NULL;
		}
		if (ws->peer_fd[b]) {
			for (int j = 0; j < ws->size; j++)
				if (ws->peer_fd[b][j] >= 0 && ws->peer_fd[b][j] != ws->fds[b])
					close(ws->peer_fd[b][j]);
			free(ws->peer_fd[b]);
			ws->peer_fd[b] = NULL;
		}
		if (ws->local[b])
			munmap(ws->local[b], mapped_bytes(ws->buf_bytes, ws->size));
		ws->local[b] = NULL;
		if (ws->fds[b] >= 0)
			close(ws->fds[b]);
		ws->fds[b] = -1;
		dptp_ipcsock_close(&ws->socks[b]);
	}
	free(ws->pulled);
	ws->pulled = NULL;
	ws->pulled_cap = 0;
	free(ws->after);
	ws->after = NULL;
	free(ws->sum);
	ws->sum = NULL;
	ws->sum_cap = 0;
	ws->buf_bytes = 0;
}

static bool unwritten_at(const void *p, size_t i, bool w32)
{
	return w32 ? ((const uint32_t *)p)[i] == 0 : ((const uint16_t *)p)[i] == 0;
}

/* Index of the first element still "not written" (zero bits) at or after
 * i, or n; in a copy of the slot: eight bytes at a time to the word that
 * holds one. */
static size_t first_unwritten(const void *p, size_t i, size_t n, enum dptp_dtype dt)
{
	const bool w32 = dt == DPTP_DTYPE_FP32;
	const size_t esz = w32 ? 4 : 2, per = 8 / esz; /* elements a word */
	const uint64_t lo = w32 ? 0x0000000100000001ULL : 0x0001000100010001ULL, hi = lo << (8 * esz - 1);
	for (; i < n && i % per; i++)
		if (unwritten_at(p, i, w32))
			return i;
	for (; i + per <= n; i += per) {
		uint64_t v;
		memcpy(&v, (const char *)p + i * esz, sizeof(v));
		if ((v - lo) & ~v & hi) /* a zero element in this word */
			break;
	}
	for (; i < n && !unwritten_at(p, i, w32); i++)
		;
	return i;
}

/* acc[i] += the value stored in slot element i. */
DPTP_HOT static void add_slot(float *acc, const void *slot, size_t n, enum dptp_dtype dt)
{
	const uint16_t *q = slot;
	switch (dt) {
	case DPTP_DTYPE_FP32:
		for (size_t i = 0; i < n; i++)
			acc[i] += dptp_u2f_(((const uint32_t *)slot)[i] ^ FLIP32);
		break;
	case DPTP_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			acc[i] += dptp_bf16_to_f32((uint16_t)(q[i] ^ FLIP16));
		break;
	case DPTP_DTYPE_FP16:
		for (size_t i = 0; i < n; i++)
			acc[i] += dptp_f16_to_f32((uint16_t)(q[i] ^ FLIP16));
		break;
	}
}

DPTP_HOT void dptp_residual_rmsnorm_ref(const float *sum, const void *residual_in, const void *gamma,
			       void *residual_out, void *norm_out, int tokens, int hidden,
			       float eps, enum dptp_dtype dt)
{
	size_t hn = (size_t)hidden, esz = dptp_dtype_bytes(dt);
	float *row = malloc(2 * hn * sizeof(float)), *g = row + hn;
	if (!row) { /* element by element, the same arithmetic */
		for (int t = 0; t < tokens; t++) {
			size_t base = (size_t)t * hn;
			float ss = 0.0f;
			for (size_t h = 0; h < hn; h++) {
				float r = sum[base + h] + dptp_load_elt(residual_in, base + h, dt);
				dptp_store_elt(residual_out, base + h, r, dt);
				float rr = dptp_load_elt(residual_out, base + h, dt);
				ss += rr * rr;
			}
			float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
			for (size_t h = 0; h < hn; h++)
				dptp_store_elt(norm_out, base + h, dptp_load_elt(residual_out, base + h, dt) * inv *
					       dptp_load_elt(gamma, h, dt), dt);
		}
		return;
	}
	dptp_load_f32(g, gamma, hn, dt);
	for (int t = 0; t < tokens; t++) {
		size_t base = (size_t)t * hn;
		char *ro = (char *)residual_out + base * esz;
		/* residual_out = sum + residual_in, rounded; the norm sees it rounded */
		dptp_load_f32(row, (const char *)residual_in + base * esz, hn, dt);
		for (size_t h = 0; h < hn; h++)
			row[h] = sum[base + h] + row[h];
		dptp_store_f32(ro, row, hn, dt);
		dptp_load_f32(row, ro, hn, dt);
		float ss = 0.0f;
		for (size_t h = 0; h < hn; h++)
			ss += row[h] * row[h];
		float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
		for (size_t h = 0; h < hn; h++)
			row[h] = row[h] * inv * g[h];
		dptp_store_f32((char *)norm_out + base * esz, row, hn, dt);
	}
	free(row);
}

/* x, -0.0 made +0.0 (-0.0 is the "not yet written" mark), stored flipped
 * (see FLIP16) into dst. */
DPTP_HOT static void lamport_encode(void *dst, const void *x, size_t n, enum dptp_dtype dt)
{
	if (dt == DPTP_DTYPE_FP32) {
		const uint32_t *src = x;
		uint32_t *d = dst;
		for (size_t i = 0; i < n; i++)
			d[i] = (src[i] == FLIP32 ? 0 : src[i]) ^ FLIP32;
	} else {
		const uint16_t *src = x;
		uint16_t *d = dst;
		for (size_t i = 0; i < n; i++)
			d[i] = (uint16_t)((src[i] == FLIP16 ? 0 : src[i]) ^ FLIP16);
	}
}

/* Elements [first, first + m) of slot j of my buffer b into dst, once they
 * have all arrived: no -0.0 left in the data, which decides, as in the
 * Lamport protocol. The writer's futex word wakes the wait, and says when
 * its push of this call is complete (ws->after[j]): only data read after
 * that counts (a pwrite is not atomic per element, so a read racing it
 * could see half an element). */
static int lamport_pull(struct dptp_workspace *ws, unsigned b, int j, void *dst, size_t first, size_t m,
			double deadline, struct dptp_err *err)
{
	size_t esz = dptp_dtype_bytes(ws->dt), off = (size_t)j * ws->slot_bytes + first * esz, i = 0;
	uint32_t *w = posted(ws->local[b], ws->buf_bytes) + j;
	/* pushes into buffer b by each writer, this call's included */
	const uint32_t expect = ws->calls / DPTP_WS_NBUF + 1;
	for (;;) {
		uint32_t seen = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		bool pushed = (int32_t)(seen - expect) >= 0;
		size_t from = pushed && !ws->after[j] ? 0 : i; /* read again, all of it, once pushed */
		ws->after[j] |= pushed;
		DPTP_TRY(buf_io(ws->fds[b], false, (char *)dst + from * esz, (m - from) * esz, off + from * esz, ws->rank,
				b, err));
		i = first_unwritten(dst, from, m, ws->dt);
		if (i == m && ws->after[j])
			return 0;
		if (dptp_now() > deadline)
			return dptp_err_set(err, -ETIMEDOUT,
				"Lamport buffer %u: still waiting for group rank %d (global rank %d): "
				"element %zu not written%s",
				b, j, ws->xg->ranks[j < ws->xg->size ? j : 0], first + i,
				i == m ? " (all there, but its push never said it was complete)" : "");
		futex_wait_until(w, seen, deadline);
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
	/* a block of whole rows at a time (it stays in cache): the sum in
	 * fp32, and every slot's part of the block */
	size_t rows = hidden < 16384 ? 16384 / (size_t)hidden : 1, blk = rows * (size_t)hidden;
	if (ws->sum_cap < blk || ws->pulled_cap < (size_t)ws->size * blk * esz) {
		float *p = realloc(ws->sum, blk * sizeof(float));
		if (p)
			ws->sum = p;
		void *q = p ? realloc(ws->pulled, (size_t)ws->size * blk * esz) : NULL;
		if (!q)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		ws->pulled = q;
		ws->sum_cap = blk;
		ws->pulled_cap = (size_t)ws->size * blk * esz;
	}
	char *pulled = ws->pulled;
	/* push: my input, encoded, into my slot of every peer's buffer b;
	 * then each peer's futex word for us, once the bytes are all there */
	for (size_t o = 0; o < n; o += blk) {
		size_t m = n - o < blk ? n - o : blk;
		lamport_encode(pulled, (const char *)x + o * esz, m, dt);
		for (int j = 0; j < ws->size; j++)
			DPTP_TRY(buf_io(ws->peer_fd[b][j], true, pulled, m * esz,
					(size_t)ws->rank * ws->slot_bytes + o * esz, j, b, err));
	}
	__atomic_thread_fence(__ATOMIC_RELEASE);
	for (int j = 0; j < ws->size; j++) {
		uint32_t *w = posted(ws->peer[b][j], ws->buf_bytes) + ws->rank;
		__atomic_fetch_add(w, 1, __ATOMIC_RELEASE);
		futex_wake_all(w);
		ws->after[j] = false;
	}
	/* pull: every peer's slot of my buffer b, a block at a time once it
	 * has arrived; the sum in group-rank order, then residual + RMSNorm */
	for (size_t r0 = 0; r0 < (size_t)tokens; r0 += rows) {
		size_t nr = (size_t)tokens - r0 < rows ? (size_t)tokens - r0 : rows;
		size_t first = r0 * (size_t)hidden, m = nr * (size_t)hidden;
		for (int j = 0; j < ws->size; j++)
			DPTP_TRY(lamport_pull(ws, b, j, pulled + (size_t)j * blk * esz, first, m, deadline, err));
		memset(ws->sum, 0, m * sizeof(float));
		for (int j = 0; j < ws->size; j++)
			add_slot(ws->sum, pulled + (size_t)j * blk * esz, m, dt);
		dptp_residual_rmsnorm_ref(ws->sum, (const char *)residual_in + first * esz, gamma,
					  (char *)residual_out + first * esz, (char *)norm_out + first * esz,
					  (int)nr, hidden, eps, dt);
	}
	/* the previous call's buffer is now safe to clear: every peer has
	 * finished writing it, and only this rank reads it; only what that
	 * call wrote needs it */
	unsigned prev = (b + DPTP_WS_NBUF - 1) % DPTP_WS_NBUF;
	for (int j = 0; j < ws->size; j++)
		DPTP_TRY(lamport_clear(ws->fds[prev], (size_t)j * ws->slot_bytes, ws->used[prev], prev, err));
	ws->used[b] = n * esz;
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
