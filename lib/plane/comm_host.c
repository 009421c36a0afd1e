/* Host data plane: each rank owns one POSIX shared-memory slot that the
 * ranks on its host map; a collective copies into the slot, fences, reads the
 * peers' slots and fences again before the slot is reused. Members on other
 * hosts are reached through the bootstrap instead.
 *
 * A slot's name is "/dptp-<job>-<attempt>-<rank>": <attempt> is a nonce the
 * whole attempt agreed on (rank 0's, learned with the peers), so a killed
 * earlier attempt of the same job (same run id, address and port) never
 * shares a name with this one: it cannot make our create fail, and nothing
 * of it is ever mapped here. */
#include "plane/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
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
	void **slot;  /* per global rank; NULL when on another host */
	float *acc;
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

/* Makes every member's contribution readable: returns pointers per group
 * index in ptrs[], backed by peers' slots or by fetched copies in tmp. */
static int gather_ptrs(struct dptp_comm *c, const struct dptp_group *g, const void *mine,
		       size_t bytes, bool want_all, int only, const void **ptrs, void **tmp,
		       struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	bool local = group_local(h, g);
	*tmp = NULL;
	if (bytes > h->cap) {
		host_round(c, NULL, 0, NULL); /* lockstep */
		return dptp_err_set(err, -E2BIG, "%zu bytes exceed the data-plane capacity %zu", bytes, h->cap);
	}
	if (mine && local)
		memcpy(h->slot[h->rank], mine, bytes);
	DPTP_TRY(host_round(c, local ? NULL : mine, bytes, err));
	*tmp = NULL;
	if (!local && !(*tmp = malloc(bytes * (size_t)g->size + 1)))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (int i = 0; i < g->size; i++) {
		ptrs[i] = NULL;
		if (!want_all && i != only)
			continue;
		int r = g->ranks[i];
		if (local) {
			ptrs[i] = h->slot[r];
		} else if (r == h->rank) {
			ptrs[i] = mine;
		} else {
			void *dst = (char *)*tmp + (size_t)i * bytes;
			DPTP_TRY(dptp_xchg_fetch(c->x, r, dst, bytes, err));
			ptrs[i] = dst;
		}
	}
	return 0;
}

/* Closes an op: when slots were used, no one may write its slot again until
 * every reader is done. */
static int finish(struct dptp_comm *c, const struct dptp_group *g, void *tmp, int rc,
		  struct dptp_err *err)
{
	struct host_impl *h = c->impl;
	free(tmp);
	struct dptp_err e2 = {0};
	(void)h;
	/* always a second round, local or not: every rank must make the same
	 * number of rounds whatever its group looks like */
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
	const void **ptrs = calloc((size_t)g->size, sizeof(*ptrs));
	void *tmp = NULL;
	if (!ptrs)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc;
	if (root < 0 || root >= g->size) {
		/* keep lockstep, then refuse */
		host_round(c, NULL, 0, NULL);
		char s[256];
		dptp_group_format(g, s, sizeof(s));
		rc = dptp_err_set(err, -EINVAL, "root %d is out of range for group %s", root, s);
	} else {
		bool am_root = g->ranks[root] == ((struct host_impl *)c->impl)->rank;
		rc = gather_ptrs(c, g, am_root ? buf : NULL, bytes, false, root, ptrs, &tmp, err);
		if (rc == 0 && !am_root)
			memcpy(buf, ptrs[root], bytes);
	}
	free(ptrs);
	return finish(c, g, tmp, rc, err);
}

static int host_allgather(struct dptp_comm *c, const struct dptp_group *g, const void *send,
			  void *recv, size_t bytes, struct dptp_err *err)
{
	const void **ptrs = calloc((size_t)g->size, sizeof(*ptrs));
	void *tmp = NULL;
	if (!ptrs)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc = gather_ptrs(c, g, send, bytes, true, -1, ptrs, &tmp, err);
	for (int i = 0; rc == 0 && i < g->size; i++)
		memcpy((char *)recv + (size_t)i * bytes, ptrs[i], bytes);
	free(ptrs);
	return finish(c, g, tmp, rc, err);
}

static int host_allreduce(struct dptp_comm *c, const struct dptp_group *g, void *buf,
			  size_t count, enum dptp_dtype dt, struct dptp_err *err)
{
	size_t bytes = count * dptp_dtype_bytes(dt);
	const void **ptrs = calloc((size_t)g->size, sizeof(*ptrs));
	void *tmp = NULL;
	if (!ptrs)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	int rc = gather_ptrs(c, g, buf, bytes, true, -1, ptrs, &tmp, err);
	struct host_impl *h = c->impl;
	const size_t esz = dptp_dtype_bytes(dt);
	/* in shared memory, a reduce-scatter then a gather: member i sums
	 * only its share of every slot, in group order as the whole sum
	 * would (the same bits), into its own slot, and each member then
	 * copies the shares -- a 1/n of the reading and summing each */
	bool split = rc == 0 && !tmp && g->index >= 0 && g->size > 1;
	if (rc == 0 && !split)
		dptp_reduce_sum(buf, (const void *const *)ptrs, g->size, count, dt);
	if (split) {
		size_t lo = count * (size_t)g->index / (size_t)g->size;
		size_t hi = count * (size_t)(g->index + 1) / (size_t)g->size;
		const void **part = calloc((size_t)g->size, sizeof(*part));
		if (!part) {
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
		} else {
			for (int j = 0; j < g->size; j++)
				part[j] = (const char *)ptrs[j] + lo * esz;
			dptp_reduce_sum((char *)h->slot[h->rank] + lo * esz, part, g->size, hi - lo, dt);
			free(part);
		}
	}
	/* every rank takes this round, split or not (lockstep) */
	struct dptp_err e2 = {0};
	int rc2 = host_round(c, NULL, 0, rc < 0 ? NULL : &e2);
	if (rc == 0 && rc2 < 0) {
		rc = rc2;
		if (err)
			*err = e2;
	}
	for (int j = 0; split && rc == 0 && j < g->size; j++) {
		size_t lo = count * (size_t)j / (size_t)g->size, hi = count * (size_t)(j + 1) / (size_t)g->size;
		memcpy((char *)buf + lo * esz, (const char *)ptrs[j] + lo * esz, (hi - lo) * esz);
	}
	free(ptrs);
	return finish(c, g, tmp, rc, err);
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
		for (int r = 0; r < h->world; r++)
			if (h->slot && h->slot[r])
				munmap(h->slot[r], h->cap);
		if (h->bar)
			munmap(h->bar, HOST_BAR_BYTES);
		free(h->slot);
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
	snprintf(buf, n, "/dptp-%016llx-%016llx-%d", (unsigned long long)job_hash(job),
		 (unsigned long long)attempt, rank);
}

/* An unsized slot is young (its owner is between creating and locking it)
 * for this long; past it, unlocked, its owner died in between. */
#define SLOT_YOUNG_S 60

/* Removes the slots of other attempts of the same job whose owner is gone:
 * "dptp-<job>-<other attempt>-<rank>", ours, not locked, and sized (or
 * unsized for SLOT_YOUNG_S). An owner locks its slot before it sizes it and
 * holds the lock until it has unlinked the name, and the lock goes with its
 * process, so a live earlier attempt (or one of another container sharing
 * /dev/shm) keeps its slots, and this attempt never opens them for
 * anything else. Any rank may remove any rank's: an attempt's ranks all
 * skip that attempt's names. */
static void sweep_stale(const char *job, uint64_t attempt)
{
	char pre[64];
	snprintf(pre, sizeof(pre), "dptp-%016llx-", (unsigned long long)job_hash(job));
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	size_t lp = strlen(pre);
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *nm = e->d_name, *rk = nm + lp + 17;
		if (strncmp(nm, pre, lp) || strlen(nm) < lp + 18 || strspn(nm + lp, "0123456789abcdef") != 16 ||
		    rk[-1] != '-' || strspn(rk, "0123456789") != strlen(rk) ||
		    strtoull(nm + lp, NULL, 16) == attempt)
			continue;
		char path[300];
		snprintf(path, sizeof(path), "/%s", nm);
		int fd = shm_open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
		struct stat st;
		if (fd < 0)
			continue;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
		    (st.st_size > 0 || st.st_mtime < time(NULL) - SLOT_YOUNG_S) && flock(fd, LOCK_EX | LOCK_NB) == 0)
			shm_unlink(path);
		close(fd);
	}
	closedir(d);
}

int dptp_comm_host_create(struct dptp_comm **out, struct dptp_exchange *x, const int *host_of,
			  size_t capacity, uint64_t attempt, struct dptp_err *err)
{
	struct dptp_bootstrap *b = x->b;
	struct dptp_comm *c = calloc(1, sizeof(*c));
	struct host_impl *h = calloc(1, sizeof(*h));
	int rc = 0;
	char name[128];
	if (!c || !h || !(h->slot = calloc((size_t)b->size, sizeof(void *)))) {
		free(c);
		if (h)
			free(h->slot);
		free(h);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	c->ops = &host_ops;
	c->x = x;
	c->impl = h;
	h->world = b->size;
	h->rank = b->rank;
	h->host_of = host_of;
	h->cap = (capacity + 4095) & ~(size_t)4095;
	if (!h->cap)
		h->cap = 4096;

	sweep_stale(b->job_id, attempt);
	dptp_comm_host_slot_name(name, sizeof(name), b->job_id, attempt, b->rank);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) {
		/* this job's, this attempt's and this rank's name: no live
		 * process of another attempt can hold it; remove it and create
		 * afresh */
		shm_unlink(name);
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	}
	/* the lock says "alive" to sweep_stale() of later attempts: taken
	 * before the slot has a size, held (fd open) until the name is gone */
	if (fd < 0) {
		rc = dptp_err_set(err, -errno, "shm_open('%s'): %s", name, strerror(errno));
	} else if (flock(fd, LOCK_EX) < 0) {
		rc = dptp_err_set(err, -errno, "flock('%s'): %s", name, strerror(errno));
	} else if (ftruncate(fd, (off_t)(h->cap + HOST_BAR_BYTES)) < 0) {
		rc = dptp_err_set(err, -errno, "ftruncate('%s', %zu): %s", name, h->cap, strerror(errno));
	} else {
		h->slot[b->rank] = mmap(NULL, h->cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (h->slot[b->rank] == MAP_FAILED) {
			h->slot[b->rank] = NULL;
			rc = dptp_err_set(err, -errno, "mmap('%s'): %s", name, strerror(errno));
		} else {
			/* the slot's pages in one call, not one write fault per
			 * 4 KiB page at the first copy (a hint: refused is fine) */
			(void)madvise(h->slot[b->rank], h->cap, MADV_POPULATE_WRITE);
		}
	}
	/* one host for the whole job: the rounds can meet in rank 0's page */
	bool single = b->size <= (int)HOST_BAR_MAX;
	for (int r = 0; r < b->size; r++)
		single &= host_of[r] == host_of[0];
	void *bar = MAP_FAILED;
	if (single && rc == 0 && b->rank == 0)
		bar = mmap(NULL, HOST_BAR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)h->cap);
	/* everyone has created its slot (or failed): map the local peers' */
	int rc2 = dptp_xchg_round(x, NULL, 0, rc < 0 ? NULL : err);
	if (rc == 0 && rc2 < 0)
		rc = rc2;
	for (int r = 0; rc == 0 && r < b->size; r++) {
		if (r == b->rank || host_of[r] != host_of[b->rank])
			continue;
		char pn[128];
		dptp_comm_host_slot_name(pn, sizeof(pn), b->job_id, attempt, r);
		int pfd = shm_open(pn, O_RDWR | O_CLOEXEC, 0600);
		if (pfd < 0) {
			rc = dptp_err_set(err, -errno, "shm_open('%s') of rank %d: %s", pn, r, strerror(errno));
			break;
		}
		/* read only here; mapped whole now rather than faulted in a
		 * page at a time by the first collective */
		h->slot[r] = mmap(NULL, h->cap, PROT_READ, MAP_SHARED | MAP_POPULATE, pfd, 0);
		if (single && r == 0)
			bar = mmap(NULL, HOST_BAR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, (off_t)h->cap);
		close(pfd);
		if (h->slot[r] == MAP_FAILED) {
			h->slot[r] = NULL;
			rc = dptp_err_set(err, -errno, "mmap of rank %d's slot: %s", r, strerror(errno));
		}
	}
	/* everyone has mapped: the names can go, nothing is left behind; and
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
		shm_unlink(name);
		close(fd);
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

