/* The host data plane on one rank (its multi-rank paths run in test_dp2tp2),
 * and the reference sum every backend shares. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "one_rank.h"
#include "plane/comm.h"
#include "plane/shm.h"

struct fixture {
	struct one_rank j;
	int host_of[1];
	struct dptp_comm *c;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct dptp_err err = {0};
	if (!f || one_rank_init(&f->j) < 0 || dptp_comm_host_create(&f->c, &f->j.x, f->host_of, 4096, 1, &err) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	dptp_comm_destroy(f->c);
	one_rank_release(&f->j);
	free(f);
	return 0;
}

static void test_ops(void **state)
{
	struct fixture *f = *state;
	struct dptp_comm *c = f->c;
	struct dptp_err err = {0};
	assert_string_equal(c->ops->name, "host");
	float in[8] = { 1, 2, 3, 4, -1, -2, 0.5f, 8 }, out[8];
	void *d = c->ops->alloc(c, sizeof(in));
	assert_non_null(d);
	assert_int_equal(c->ops->upload(c, d, in, sizeof(in)), 0);
	assert_int_equal(c->ops->bcast(c, &f->j.world, d, sizeof(in), 0, &err), 0);
	assert_int_equal(c->ops->allreduce(c, &f->j.world, d, 8, DPTP_DTYPE_FP32, &err), 0);
	assert_int_equal(c->ops->download(c, out, d, sizeof(out)), 0);
	assert_memory_equal(in, out, sizeof(in));
	float g[8];
	assert_int_equal(c->ops->allgather(c, &f->j.world, in, g, sizeof(in), &err), 0);
	assert_memory_equal(in, g, sizeof(in));
	c->ops->free(c, d);
	assert_int_equal(f->j.x.seq > 0, 1); /* every op took its exchange rounds */
}

static void test_capacity(void **state)
{
	struct fixture *f = *state;
	struct dptp_err err = {0};
	void *big = calloc(1, 8192);
	assert_non_null(big);
	uint64_t seq = f->j.x.seq;
	assert_int_equal(f->c->ops->bcast(f->c, &f->j.world, big, 8192, 0, &err), -E2BIG);
	assert_string_equal(err.msg, "8192 bytes exceed the data-plane capacity 4096");
	assert_true(f->j.x.seq > seq); /* refused, still in lockstep */
	free(big);
}

/* fp32 accumulation in rank order, rounded once: 256 + 1 + 1 in bf16 is 258
 * (bf16 after each step would give 256). */
static void test_reduce_sum(void **state)
{
	uint16_t a[2] = { dptp_f32_to_bf16(256), dptp_f32_to_bf16(1) };
	uint16_t b[2] = { dptp_f32_to_bf16(1), dptp_f32_to_bf16(2) };
	uint16_t cc[2] = { dptp_f32_to_bf16(1), dptp_f32_to_bf16(-3) };
	const void *in[3] = { a, b, cc };
	uint16_t out[2];
	dptp_reduce_sum(out, in, 3, 2, DPTP_DTYPE_BF16);
	assert_true(dptp_bf16_to_f32(out[0]) == 258.0f);
	assert_true(dptp_bf16_to_f32(out[1]) == 0.0f);
	float fa[1] = { 1e8f }, fb[1] = { 1 }, fc[1] = { -1e8f }, fo[1];
	const void *fin[3] = { fa, fb, fc };
	dptp_reduce_sum(fo, fin, 3, 1, DPTP_DTYPE_FP32);
	assert_true(fo[0] == 0.0f); /* (1e8 + 1) - 1e8 in fp32, in that order */
}

/* A slot of an earlier attempt of the same job, made as its owner makes
 * one: created, locked while alive, sized, marked. */
static int plant(const char *job, uint64_t attempt, int rank, off_t size, bool lock, char *name)
{
	dptp_comm_host_slot_name(name, 128, job, attempt, rank);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	if (lock)
		assert_int_equal(flock(fd, LOCK_EX), 0);
	assert_int_equal(ftruncate(fd, size), 0);
	if (size)
		assert_int_equal(pwrite(fd, "stale", 5, 0), 5);
	if (!lock) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool exists(const char *name, const char *marker)
{
	int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return false;
	char got[8] = "";
	ssize_t n = pread(fd, got, 5, 0);
	close(fd);
	if (marker)
		assert_memory_equal(got, marker, 5);
	return n >= 0;
}

/* Each attempt names its slots with its own nonce, and the slots of every
 * job whose owner is gone are removed: dead ones (of any attempt, any job;
 * unsized ones once a minute old), never one whose owner still holds it or
 * is between creating and sizing it; this attempt's own name is gone once
 * created. */
static void test_stale_attempts(void **state)
{
	struct one_rank j;
	struct dptp_err err = {0};
	struct dptp_comm *c = NULL;
	int host_of[1] = {0};
	char dead[128], alive[128], young[128], old[128], other[128], mine[128], job2[128], foreign[128];
	assert_int_equal(one_rank_init(&j), 0);
	const char *job = j.b->job_id;
	snprintf(job2, sizeof(job2), "%s-another", job);
	plant(job, 0x11, 0, 4096, false, dead);
	int lk = plant(job, 0x22, 0, 4096, true, alive);
	plant(job, 0x33, 0, 0, false, young);
	plant(job, 0x34, 3, 0, false, old);
	struct timespec past[2] = {{.tv_sec = time(NULL) - 120}, {.tv_sec = time(NULL) - 120}};
	char path[160];
	snprintf(path, sizeof(path), "/dev/shm%s", old);
	assert_int_equal(utimensat(AT_FDCWD, path, past, 0), 0); /* its owner died a while ago */
	plant(job, 0x44, 7, 4096, false, other);
	plant(job2, 0x11, 0, 4096, false, foreign); /* another job's, dead: removed too */
	dptp_comm_host_slot_name(mine, sizeof(mine), job, 0x55, 0);
	assert_int_equal(dptp_comm_host_create(&c, &j.x, host_of, 4096, 0x55, &err), 0);
	assert_false(exists(dead, NULL));
	assert_true(exists(alive, "stale"));
	assert_true(exists(young, NULL));
	assert_false(exists(old, NULL));
	assert_false(exists(other, NULL));
	assert_false(exists(foreign, NULL));
	assert_false(exists(mine, NULL));
	dptp_comm_destroy(c);
	close(lk); /* the owner of "alive" dies: the next attempt removes it */
	assert_int_equal(dptp_comm_host_create(&c, &j.x, host_of, 4096, 0x66, &err), 0);
	assert_false(exists(alive, NULL));
	dptp_comm_destroy(c);
	shm_unlink(young);
	one_rank_release(&j);
}

/* A name made locked is sized and held from its first moment; it exists
 * once; the sweep leaves it alone while it is held (whatever the name's
 * form: a resources segment too) and removes it once its holder has closed
 * it; names of other forms are never touched. Another user's dead name stays
 * (root only: made and owned by uid 65534). */
static void test_shm_locked(void **state)
{
	char seg[96], stranger[96], theirs[96];
	snprintf(seg, sizeof(seg), "/dptp-lk-res-%016llx-host-tp0-dp0", (unsigned long long)getpid() * 0x9e3779b97f4a7c15ULL);
	snprintf(stranger, sizeof(stranger), "/dptp-notours-%d", (int)getpid());
	snprintf(theirs, sizeof(theirs), "/dptp-lk-%016llx-%016llx-9", 0x5eedULL + (unsigned long long)getpid(), 7ULL);
	int fd = dptp_shm_create_locked(seg, 8192);
	assert_true(fd >= 0);
	assert_int_equal(dptp_shm_create_locked(seg, 8192), -EEXIST);
	int peer = shm_open(seg, O_RDONLY | O_CLOEXEC, 0);
	struct stat st;
	assert_true(peer >= 0);
	assert_int_equal(fstat(peer, &st), 0);
	assert_int_equal(st.st_size, 8192);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(flock(peer, LOCK_EX | LOCK_NB), -1); /* held */
	int junk = shm_open(stranger, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(junk >= 0);
	assert_int_equal(ftruncate(junk, 4096), 0);
	close(junk);
	bool root = geteuid() == 0;
	if (root) {
		int t = shm_open(theirs, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		assert_true(t >= 0);
		assert_int_equal(ftruncate(t, 4096), 0);
		assert_int_equal(fchown(t, 65534, 65534), 0);
		close(t);
	}
	dptp_shm_sweep();
	assert_true(exists(seg, NULL));
	close(fd); /* its owner dies */
	dptp_shm_sweep();
	assert_false(exists(seg, NULL));
	assert_true(exists(stranger, NULL));
	if (root) {
		assert_true(exists(theirs, NULL));
		shm_unlink(theirs);
	}
	shm_unlink(stranger);
	close(peer);
}

/* An older dptp-check makes its names without the lock (and without
 * "lk-"): unlocked, they may be a job of that version running now. The
 * sweep leaves them alone until they are an hour old (that version unlinks
 * its names once its ranks have opened them). */
static void test_shm_legacy(void **state)
{
	char slot[96], seg[96], path[128];
	unsigned long long u = (unsigned long long)getpid() * 0x9e3779b97f4a7c15ULL;
	snprintf(slot, sizeof(slot), "/dptp-%016llx-%016llx-0", u, 7ULL);
	snprintf(seg, sizeof(seg), "/dptp-res-%016llx-host-tp0-dp1", u);
	const char *names[] = { slot, seg };
	for (int i = 0; i < 2; i++) {
		int fd = shm_open(names[i], O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, 4096), 0); /* sized, unlocked, closed */
		close(fd);
	}
	dptp_shm_sweep();
	assert_true(exists(slot, NULL));
	assert_true(exists(seg, NULL));
	struct timespec past[2] = {{.tv_sec = time(NULL) - 7200}, {.tv_sec = time(NULL) - 7200}};
	snprintf(path, sizeof(path), "/dev/shm%s", slot);
	assert_int_equal(utimensat(AT_FDCWD, path, past, 0), 0);
	dptp_shm_sweep();
	assert_false(exists(slot, NULL)); /* two hours old: a dead job's */
	assert_true(exists(seg, NULL));
	shm_unlink(seg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ops, setup, teardown),
		cmocka_unit_test_setup_teardown(test_capacity, setup, teardown),
		cmocka_unit_test(test_reduce_sum),
		cmocka_unit_test(test_stale_attempts),
		cmocka_unit_test(test_shm_locked),
		cmocka_unit_test(test_shm_legacy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
