/* The host data plane on one rank (its multi-rank paths run in test_dp2tp2),
 * and the reference sum every backend shares. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "one_rank.h"
#include "plane/comm.h"

struct fixture {
	struct one_rank j;
	int host_of[1];
	struct dptp_comm *c;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct dptp_err err = {0};
	if (!f || one_rank_init(&f->j) < 0 || dptp_comm_host_create(&f->c, &f->j.x, f->host_of, 4096, &err) < 0)
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ops, setup, teardown),
		cmocka_unit_test_setup_teardown(test_capacity, setup, teardown),
		cmocka_unit_test(test_reduce_sum),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
