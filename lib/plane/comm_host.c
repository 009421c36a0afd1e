/* Host data plane: each rank owns one POSIX shared-memory slot that the
 * ranks on its host open; a collective writes into the slot (pwrite),
 * fences, reads the peers' slots (pread) and fences again before the slot
 * is reused. Members on other
 * hosts are reached through the bootstrap instead.
 *
 * A slot's name is "/dptp-<job>-<attempt>-<rank>": <attempt> is a nonce the
 * whole attempt agreed on (rank 0's, learned with the peers), so a killed
 * earlier attempt of the same job (same run id, address and port) never
 * shares a name with this one: it cannot make our create fail, and nothing
 * of it is ever opened here. Each slot is locked by its owner from before
 * its name exists (plane/shm.h): a slot nobody holds is a dead job's, and
 * the host's first rank removes those of every job. */
#include "plane/comm.h"
#include "plane/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

/* The rounds of a job whose ranks all share one host: a barrier in a
 * page after the lowest rank's slot, futex-woken, instead of a fence
 * through the launcher (a PMIx or TCPStore round trip and several context
 * switches: 0.3 ms idle, several ms on a loaded 2-core machine; a check
 * takes 2-3 rounds per collective). arrived[] names who is missing when
 * the deadline passes. */
struct host_bar {
	uint32_t count, gen;
	uint32_t pad[14];
	uint64_t arrived[]; /* [world]: the last round each rank entered */
};
#define HOST_BAR_BYTES 4096
#define HOST_BAR_MAX ((HOST_BAR_BYTES - sizeof(struct host_bar)) / sizeof(uint64_t))

struct host_impl {
	int world, rank;
	const int *host_of;
	size_t cap;
	int *fd;      /* per global rank: its slot, open; -1 when on another host */
	struct host_bar *bar; /* NULL: rounds go through the bootstrap */
};

/* A round of the host plane: every rank of the job takes it. */
static int host_round(struct dptp_comm *c, const void *mine, size_t len, struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	struct dptp_exchange *x = c->x;
	struct host_bar *b = h->bar;
	if (!b || mine)
		return dptp_xchg_round(x, mine, len, err);
	x->seq++;
	if (x->broken)
		return dptp_err_set(err, -ETIMEDOUT, "not attempted: an earlier collective timed out");
	uint32_t g = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
	__atomic_store_n(&b->arrived[h->rank], x->seq, __ATOMIC_RELEASE);
	if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)h->world) {
		__atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
		__atomic_add_fetch(&b->gen, 1, __ATOMIC_RELEASE);
		syscall(SYS_futex, &b->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		return 0;
	}
	while (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == g) {
		double left = x->deadline - dptp_now();
		if (left <= 0) {
			char who[256] = "";
			size_t o = 0;
			for (int r = 0; r < h->world && o < sizeof(who); r++)
				if (__atomic_load_n(&b->arrived[r], __ATOMIC_ACQUIRE) < x->seq)
					o += (size_t)snprintf(who + o, sizeof(who) - o, "%s%d", o ? ", " : "", r);
			x->broken = true;
			return dptp_err_set(err, -ETIMEDOUT,
				"round %llu over %d ranks did not complete by the deadline (a peer never arrived: rank %s)",
				(unsigned long long)x->seq, h->world, who);
		}
		if (left > 0.5)
			left = 0.5;
		struct timespec ts = { (time_t)left, (long)((left - (double)(time_t)left) * 1e9) };
		syscall(SYS_futex, &b->gen, FUTEX_WAIT, g, &ts, NULL, 0);
	}
	return 0;
}

static bool group_local(const struct host_impl *h, const struct dptp_group *g)
{
	int me = h->host_of[h->rank];
	for (int i = 0; i < g->size; i++)
		if (h->host_of[g->ranks[i]] != me)
			return false;
	return true;
}

/* Slots are read and written with pread/pwrite (dptp_fd_io), not through
 * a mapping: no page faults in peers' slots, and the ranks' own buffers
 * stay the huge pages they are. */
static int slot_io(int fd, bool wr, void *p, size_t bytes, size_t off, int rank, struct dptp_err *err)
{
	int rc = dptp_fd_io(fd, wr, p, bytes, off);
	return rc < 0 ? dptp_err_set(err, rc, "%s rank %d's slot at byte %zu: %s", wr ? "writing" : "reading", rank,
				     off, strerror(-rc)) : 0;
}

/* Publishes mine (bytes) for the group: into this rank's slot when the
 * group is on this host, through the bootstrap otherwise; then a round,
 * taken whatever happened (lockstep). */
static int publish(struct dptp_comm *c, const struct dptp_group *g, const void *mine, size_t bytes,
		   struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	bool local = group_local(h, g);
	if (bytes > h->cap) {
		host_round(c, NULL, 0, NULL);
		return dptp_err_set(err, -E2BIG, "%zu bytes exceed the data-plane capacity %zu", bytes, h->cap);
	}
	int rc = 0;
	if (mine && local)
		rc = slot_io(h->fd[h->rank], true, (void *)mine, bytes, 0, h->rank, err);
	int rc2 = host_round(c, local ? NULL : mine, bytes, rc < 0 ? NULL : err);
	return rc < 0 ? rc : rc2;
}

/* Copies `bytes` at `off` of what group member i published into dst: from
 * its slot when the group is on this host, else from the bootstrap (which
 * holds the whole contribution: off 0). */
static int fetch(struct dptp_comm *c, const struct dptp_group *g, int i, void *dst, size_t off, size_t bytes,
		 struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	int r = g->ranks[i];
	if (group_local(h, g))
		return slot_io(h->fd[r], false, dst, bytes, off, r, err);
	return dptp_xchg_fetch(c->x, r, dst, bytes, err);
}

/* Closes an op: no one may write its slot again until every reader is
 * done. Always a second round, local or not: every rank must make the same
 * number of rounds whatever its group looks like. */
static int finish(struct dptp_comm *c, int rc, struct dptp_err *err)
{
	struct dptp_err e2 = {0};
	int rc2 = host_round(c, NULL, 0, &e2);
	if (rc < 0)
		return rc;
	if (rc2 < 0) {
		if (err)
			*err = e2;
		return rc2;
	}
	return 0;
}

static int host_bcast(struct dptp_comm *c, const struct dptp_group *g, void *buf, size_t bytes,
		      int root, struct dptp_err *err)
{
	int rc;
	if (root < 0 || root >= g->size) {
		/* keep lockstep, then refuse */
		host_round(c, NULL, 0, NULL);
		char s[256];
		dptp_group_format(g, s, sizeof(s));
		rc = dptp_err_set(err, -EINVAL, "root %d is out of range for group %s", root, s);
	} else {
		bool am_root = g->ranks[root] == ((struct host_impl *)c->impl)->rank;
		rc = publish(c, g, am_root ? buf : NULL, bytes, err);
		if (rc == 0 && !am_root)
			rc = fetch(c, g, root, buf, 0, bytes, err);
	}
	return finish(c, rc, err);
}

static int host_allgather(struct dptp_comm *c, const struct dptp_group *g, const void *send,
			  void *recv, size_t bytes, struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	int rc = publish(c, g, send, bytes, err);
	for (int i = 0; rc == 0 && i < g->size; i++) {
		char *dst = (char *)recv + (size_t)i * bytes;
		if (g->ranks[i] == h->rank)
			memcpy(dst, send, bytes);
		else
			rc = fetch(c, g, i, dst, 0, bytes, err);
	}
	return finish(c, rc, err);
}

/* Elements [lo, hi) of the members' published contributions (mine, this
 * rank's, read in place when it is one of them), summed in group order
 * into out, which may be mine + lo (a block is summed before it is
 * stored); a block of elements at a time. */
#define RED_BLK ((size_t)16384)
static int reduce_range(struct dptp_comm *c, const struct dptp_group *g, const void *mine, void *out, size_t lo,
			size_t hi, enum dptp_dtype dt, struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	const size_t esz = dptp_dtype_bytes(dt);
	/* off this host, lo is 0 and the block is everything: the bootstrap
	 * hands out whole contributions */
	size_t blk = group_local(h, g) ? RED_BLK : hi - lo;
	char *tmp = malloc((size_t)g->size * blk * esz + 1);
	const void **part = calloc((size_t)g->size, sizeof(*part));
	int rc = tmp && part ? 0 : dptp_err_set(err, -ENOMEM, "out of memory");
	for (size_t b = lo; rc == 0 && b < hi; b += blk) {
		size_t m = hi - b < blk ? hi - b : blk;
		for (int j = 0; rc == 0 && j < g->size; j++) {
			if (mine && g->ranks[j] == h->rank) {
				part[j] = (const char *)mine + b * esz;
			} else {
				part[j] = tmp + (size_t)j * blk * esz;
				rc = fetch(c, g, j, (void *)part[j], b * esz, m * esz, err);
			}
		}
		if (rc == 0)
			dptp_reduce_sum((char *)out + (b - lo) * esz, part, g->size, m, dt);
	}
	free(part);
	free(tmp);
	return rc;
}

static int host_allreduce(struct dptp_comm *c, const struct dptp_group *g, void *buf,
			  size_t count, enum dptp_dtype dt, struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	const size_t esz = dptp_dtype_bytes(dt);
	int rc = publish(c, g, buf, count * esz, err);
	/* on one host, a reduce-scatter then a gather: member i sums only its
	 * share of every slot, in group order as the whole sum would (the
	 * same bits), and publishes it in its own slot; each member then
	 * reads the others' shares -- a 1/n of the reading and summing each */
	bool split = group_local(h, g) && g->index >= 0 && g->size > 1;
	size_t lo = split ? count * (size_t)g->index / (size_t)g->size : 0;
	size_t hi = split ? count * (size_t)(g->index + 1) / (size_t)g->size : count;
	if (rc == 0)
		rc = reduce_range(c, g, g->index >= 0 ? buf : NULL, (char *)buf + lo * esz, lo, hi, dt, err);
	if (rc == 0 && split)
		rc = slot_io(h->fd[h->rank], true, (char *)buf + lo * esz, (hi - lo) * esz, lo * esz, h->rank, err);
	/* every rank takes this round, split or not (lockstep) */
	struct dptp_err e2 = {0};
	int rc2 = host_round(c, NULL, 0, rc < 0 ? NULL : &e2);
	if (rc == 0 && rc2 < 0) {
		rc = rc2;
		if (err)
			*err = e2;
	}
	for (int j = 0; split && rc == 0 && j < g->size; j++) {
		size_t l = count * (size_t)j / (size_t)g->size, e = count * (size_t)(j + 1) / (size_t)g->size;
		if (j != g->index)
			rc = fetch(c, g, j, (char *)buf + l * esz, l * esz, (e - l) * esz, err);
	}
	return finish(c, rc, err);
}

/* Buffers of a megabyte or more come from dptp_big_alloc (huge pages:
 * a first touch of a 4 KiB page costs 3-12 us on a virtual machine); a
 * header before the buffer says which allocator and how big. */
#define HOST_HDR 64
#define HOST_BIG ((size_t)1 << 20)

static void *host_alloc(struct dptp_comm *c, size_t bytes)
{
	size_t n = bytes + HOST_HDR;
	char *p = n >= HOST_BIG ? dptp_big_alloc(n) : malloc(n);
	if (!p)
		return NULL;
	memcpy(p, &n, sizeof(n));
	return p + HOST_HDR;
}

static void host_free(struct dptp_comm *c, void *buf)
{
	if (!buf)
		return;
	char *p = (char *)buf - HOST_HDR;
	size_t n;
	memcpy(&n, p, sizeof(n));
	if (n >= HOST_BIG)
		dptp_big_free(p, n);
	else
		free(p);
}
static int host_copy(struct dptp_comm *c, void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
	return 0;
}

static void host_destroy(struct dptp_comm *c)
{
	if (!c)
		return;
	struct host_impl *h = c->impl;
	if (h) {
		for (int r = 0; h->fd && r < h->world; r++)
			if (h->fd[r] >= 0)
				close(h->fd[r]);
		if (h->bar)
			munmap(h->bar, HOST_BAR_BYTES);
		free(h->fd);
		free(h);
	}
	free(c);
}

static const struct dptp_comm_ops host_ops = {
	.name = "host",
	.bcast = host_bcast,
	.allgather = host_allgather,
	.allreduce = host_allreduce,
	.alloc = host_alloc,
	.free = host_free,
	.upload = host_copy,
	.download = host_copy,
	.destroy = host_destroy,
};

static uint64_t job_hash(const char *job)
{
	/* the job id (PMIx namespace, run id) makes two jobs on a host distinct */
	uint64_t hsh = 1469598103934665603ULL;
	for (const char *p = job; *p; p++)
		hsh = (hsh ^ (unsigned char)*p) * 1099511628211ULL;
	return hsh;
}

void dptp_comm_host_slot_name(char *buf, size_t n, const char *job, uint64_t attempt, int rank)
{
	snprintf(buf, n, "/dptp-lk-%016llx-%016llx-%d", (unsigned long long)job_hash(job),
		 (unsigned long long)attempt, rank);
}

int dptp_comm_host_create(struct dptp_comm **out, struct dptp_exchange *x, const int *host_of,
			  size_t capacity, uint64_t attempt, struct dptp_err *err)
{
	struct dptp_bootstrap *b = x->b;
	struct dptp_comm *c = calloc(1, sizeof(*c));
	struct host_impl *h = calloc(1, sizeof(*h));
	int rc = 0;
	char name[128];
	if (!c || !h || !(h->fd = malloc((size_t)b->size * sizeof(int)))) {
		free(c);
		free(h);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	c->ops = &host_ops;
	c->x = x;
	c->impl = h;
	h->world = b->size;
	for (int r = 0; r < b->size; r++)
		h->fd[r] = -1;
	h->rank = b->rank;
	h->host_of = host_of;
	h->cap = (capacity + 4095) & ~(size_t)4095;
	if (!h->cap)
		h->cap = 4096;

	/* slots (of any job) whose owner is gone: the host's first rank
	 * removes them, so that a killed job's leave no trace for long */
	int first = 0;
	while (host_of[first] != host_of[b->rank])
		first++;
	if (first == b->rank)
		dptp_shm_sweep();
	dptp_comm_host_slot_name(name, sizeof(name), b->job_id, attempt, b->rank);
	/* locked before its name exists, held (fd open) until the name is
	 * gone: "alive" to every sweep */
	int fd = dptp_shm_create_locked(name, (off_t)(h->cap + HOST_BAR_BYTES));
	if (fd == -EEXIST) {
		/* this job's, this attempt's and this rank's name: no live
		 * process of another attempt can hold it; remove it and create
		 * afresh */
		shm_unlink(name);
		fd = dptp_shm_create_locked(name, (off_t)(h->cap + HOST_BAR_BYTES));
	}
	if (fd < 0)
		rc = dptp_err_set(err, fd, "creating '%s' (%zu bytes): %s", name, h->cap + HOST_BAR_BYTES, strerror(-fd));
	/* one host for the whole job: the rounds can meet in rank 0's page */
	bool single = b->size <= (int)HOST_BAR_MAX;
	for (int r = 0; r < b->size; r++)
		single &= host_of[r] == host_of[0];
	void *bar = MAP_FAILED;
	if (single && rc == 0 && b->rank == 0)
		bar = mmap(NULL, HOST_BAR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)h->cap);
	/* everyone has created its slot (or failed): open the local peers' */
	int rc2 = dptp_xchg_round(x, NULL, 0, rc < 0 ? NULL : err);
	if (rc == 0 && rc2 < 0)
		rc = rc2;
	for (int r = 0; rc == 0 && r < b->size; r++) {
		if (r == b->rank || host_of[r] != host_of[b->rank])
			continue;
		char pn[128];
		dptp_comm_host_slot_name(pn, sizeof(pn), b->job_id, attempt, r);
		/* read only, but for the barrier page after rank 0's slot */
		bool bar_here = single && r == 0;
		int pfd = shm_open(pn, (bar_here ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0600);
		if (pfd < 0) {
			rc = dptp_err_set(err, -errno, "shm_open('%s') of rank %d: %s", pn, r, strerror(errno));
			break;
		}
		h->fd[r] = pfd;
		if (bar_here)
			bar = mmap(NULL, HOST_BAR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, (off_t)h->cap);
	}
	/* everyone has opened: the names can go, nothing is left behind; and
	 * the barrier is used only where every rank has it (each says so) */
	int32_t have = bar != MAP_FAILED;
	rc2 = dptp_xchg_round(x, single ? &have : NULL, single ? sizeof(have) : 0, rc < 0 ? NULL : err);
	for (int r = 0; single && rc2 == 0 && have && r < b->size; r++) {
		int32_t theirs = 0;
		if (r != b->rank && dptp_xchg_fetch(x, r, &theirs, sizeof(theirs), NULL) < 0)
			theirs = 0;
		have = r == b->rank || theirs;
	}
	if (have && rc == 0 && rc2 == 0)
		h->bar = bar;
	else if (bar != MAP_FAILED)
		munmap(bar, HOST_BAR_BYTES);
	if (fd >= 0) {
		/* kept open (and locked) for the job's collectives */
		shm_unlink(name);
		h->fd[b->rank] = fd;
	}
	if (rc == 0 && rc2 < 0)
		rc = rc2;
	if (rc < 0) {
		host_destroy(c);
		return rc;
	}
	*out = c;
	return 0;
}

