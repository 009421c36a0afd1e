/* kernels/plan.c: the fused kernels' host-side planning, testable without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "plan.h"

static void test_choose(void **state)
{
	/* TP 1 never communicates */
	assert_int_equal(dptp_ar_choose(1, 128, 4096, DPTP_DTYPE_BF16), DPTP_AR_NORM_ONLY);
	/* small messages one-shot, large two-shot, vLLM's SM90 limits per TP */
	assert_int_equal(dptp_ar_choose(2, 128, 4096, DPTP_DTYPE_BF16), DPTP_AR_ONESHOT);
	assert_int_equal(dptp_ar_choose(8, 2048, 8192, DPTP_DTYPE_BF16), DPTP_AR_TWOSHOT);
	assert_true(dptp_ar_oneshot_max_bytes(2) > dptp_ar_oneshot_max_bytes(4));
	assert_true(dptp_ar_oneshot_max_bytes(4) > dptp_ar_oneshot_max_bytes(8));
	/* two-shot needs tokens >= ranks: fewer tokens stay one-shot */
	assert_int_equal(dptp_ar_choose(8, 4, 32768, DPTP_DTYPE_FP32), DPTP_AR_ONESHOT);
}

static void test_validate(void **state)
{
	struct dptp_err err = {0};
	assert_int_equal(dptp_ar_validate(4, 16, 4096, DPTP_DTYPE_BF16, 1 << 20, DPTP_AR_AUTO, &err), 0);
	assert_true(dptp_ar_validate(3, 16, 4096, DPTP_DTYPE_BF16, 1 << 20, DPTP_AR_AUTO, &err) < 0);
	assert_string_equal(err.msg, "ranks 3: the fused kernels take 1, 2, 4 or 8");
	assert_true(dptp_ar_validate(2, 16, 4100, DPTP_DTYPE_BF16, 1 << 20, DPTP_AR_AUTO, &err) < 0);
	assert_string_equal(err.msg, "hidden 4100: must be a positive multiple of 8, at most 32768");
	assert_true(dptp_ar_validate(2, 16, 4096, DPTP_DTYPE_BF16, 1024, DPTP_AR_AUTO, &err) < 0);
	assert_string_equal(err.msg, "16 tokens x 4096 hidden = 131072 bytes: the workspace holds 1024");
	assert_true(dptp_ar_validate(8, 4, 4096, DPTP_DTYPE_BF16, 1 << 20, DPTP_AR_TWOSHOT, &err) < 0);
	assert_string_equal(err.msg, "two-shot needs tokens >= ranks (4 < 8)");
	assert_true(strlen(err.msg) > 0);
}

static void test_layout_aligned_and_disjoint(void **state)
{
	for (int n = 1; n <= 8; n *= 2) {
		struct dptp_ar_layout l;
		assert_int_equal(dptp_ar_layout_get(n, 1000000, &l), 0);
		assert_true(l.slot_bytes >= 1000000);
		size_t offs[] = { l.lamport[0], l.lamport[1], l.lamport[2], l.scatter, l.gather_res,
				  l.gather_norm, l.flags };
		for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
			assert_int_equal(offs[i] % 256, 0);
			if (i)
				assert_true(offs[i] > offs[i - 1]);
		}
		/* each Lamport buffer holds n slots */
		assert_true(l.lamport[1] - l.lamport[0] >= (size_t)n * l.slot_bytes);
		assert_true(l.total > l.flags);
		assert_int_equal(dptp_cuda_ar_buffer_bytes(n, 1000000), l.total);
	}
	struct dptp_ar_layout l;
	assert_true(dptp_ar_layout_get(3, 1000, &l) < 0);
	assert_true(dptp_ar_layout_get(2, 0, &l) < 0);
}

static void test_slices_cover_rows(void **state)
{
	for (size_t tokens = 1; tokens < 40; tokens++) {
		for (int n = 2; n <= 8; n *= 2) {
			size_t next = 0;
			for (int s = 0; s < n; s++) {
				size_t b, e;
				dptp_ar_slice(tokens, n, s, &b, &e);
				assert_int_equal(b, next);
				assert_true(e >= b);
				next = e;
			}
			assert_int_equal(next, tokens);
		}
	}
}

static void test_shape(void **state)
{
	struct dptp_ar_shape s;
	assert_int_equal(dptp_ar_shape_get(4096, DPTP_DTYPE_BF16, &s), 0);
	assert_int_equal(s.hvec, 4096 * 2 / 16);
	assert_true((size_t)s.threads * (size_t)s.vpt >= s.hvec);
	assert_int_equal(s.threads % 32, 0);
	assert_true(s.threads <= 512);
	assert_true(dptp_ar_grid(DPTP_AR_ONESHOT, 2, 128, 0, 64) <= 64);
	assert_true(dptp_ar_grid(DPTP_AR_NORM_ONLY, 1, 128, 16, 64) <= 16);
}

static void test_norm_shape(void **state)
{
	(void)state;
	const enum dptp_dtype dts[] = {DPTP_DTYPE_BF16, DPTP_DTYPE_FP16, DPTP_DTYPE_FP32};
	const size_t hiddens[] = {8, 64, 1000, 4096, 8192, 16384, 32768};
	for (size_t d = 0; d < 3; d++)
		for (size_t h = 0; h < sizeof(hiddens) / sizeof(hiddens[0]); h++)
			for (int v = 1; v <= 8; v *= 2) {
				struct dptp_ar_shape s;
				int rc = dptp_ar_norm_shape_get(hiddens[h], dts[d], v, &s);
				if (hiddens[h] > dptp_cuda_ar_max_hidden(dts[d])) {
					assert_true(rc < 0);
					continue;
				}
				assert_int_equal(rc, 0);
				/* every vector of the row has a thread, blocks are whole warps */
				assert_true((size_t)s.threads * (size_t)s.vpt >= s.hvec);
				assert_int_equal(s.threads % 32, 0);
				assert_true(s.threads >= 32 && s.threads <= 512);
				assert_true(s.vpt == 1 || s.vpt == 2 || s.vpt == 4 || s.vpt == 8);
				/* vpt_min is kept unless the row is too short or too long for it */
				if (s.hvec >= (size_t)v * 32 && s.hvec <= (size_t)v * 512)
					assert_int_equal(s.vpt, v);
			}
	struct dptp_ar_shape s;
	assert_int_equal(dptp_ar_norm_shape_get(8192, DPTP_DTYPE_BF16, 4, &s), 0);
	assert_int_equal(s.vpt, 4);
	assert_int_equal(s.threads, 256);
	assert_true(dptp_ar_norm_shape_get(8192, DPTP_DTYPE_BF16, 3, &s) < 0);
	/* the default's L2 prefetches only at 512 threads x 2 vectors */
	assert_int_equal(dptp_ar_norm_shape_get(8192, DPTP_DTYPE_BF16, 2, &s), 0);
	assert_int_equal(dptp_ar_norm_default_flags(&s), DPTP_NORM_FLAGS);
	const int l2pf = DPTP_NORM_L2PF | DPTP_NORM_L2PF_LINES | DPTP_NORM_L2PF_LATE;
	const size_t other[][2] = {{4096, 2}, {16384, 2}, {8192, 4}, {1000, 2}};
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
		assert_int_equal(dptp_ar_norm_shape_get(other[i][0], DPTP_DTYPE_BF16, (int)other[i][1], &s), 0);
		assert_int_equal(dptp_ar_norm_default_flags(&s), DPTP_NORM_FLAGS & ~l2pf);
	}
	assert_int_equal(dptp_ar_norm_shape_get(8192, DPTP_DTYPE_FP32, 2, &s), 0);
	assert_int_equal(dptp_ar_norm_default_flags(&s) & l2pf, 0);
	/* the norm kernel's blocks loop over rows: the grid is what fits, or fewer */
	assert_int_equal(dptp_ar_grid(DPTP_AR_NORM_ONLY, 1, 2048, 0, 264), 264);
	assert_int_equal(dptp_ar_grid(DPTP_AR_NORM_ONLY, 1, 100, 0, 264), 100);
	assert_int_equal(dptp_ar_grid(DPTP_AR_NORM_ONLY, 1, 2048, 0, 0), 2048);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_choose),
		cmocka_unit_test(test_validate),
		cmocka_unit_test(test_layout_aligned_and_disjoint),
		cmocka_unit_test(test_slices_cover_rows),
		cmocka_unit_test(test_shape),
		cmocka_unit_test(test_norm_shape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
