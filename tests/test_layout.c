/* Layout against hand-computed vLLM group lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/layout.h"

static void expect_group(const struct dptp_layout *l, enum dptp_group_kind k, int rank,
			 const int *want, int n, int want_idx)
{
	int got[DPTP_MAX_WORLD], idx = -1;
	int size = dptp_layout_group(l, k, rank, got, &idx);
	assert_int_equal(size, n);
	assert_memory_equal(got, want, sizeof(int) * (size_t)n);
	assert_int_equal(idx, want_idx);
}

static void test_dp2tp2(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 4, 2, 1, 2, NULL), 0);
	expect_group(&l, DPTP_GROUP_TP, 0, (int[]){0, 1}, 2, 0);
	expect_group(&l, DPTP_GROUP_TP, 3, (int[]){2, 3}, 2, 1);
	expect_group(&l, DPTP_GROUP_DP, 0, (int[]){0, 2}, 2, 0);
	expect_group(&l, DPTP_GROUP_DP, 3, (int[]){1, 3}, 2, 1);
	expect_group(&l, DPTP_GROUP_EP, 2, (int[]){0, 1, 2, 3}, 4, 2);
	expect_group(&l, DPTP_GROUP_PP, 2, (int[]){2}, 1, 0);
	struct dptp_coord c = dptp_layout_coord(&l, 3);
	assert_int_equal(c.dp, 1);
	assert_int_equal(c.tp, 1);
	assert_int_equal(c.pp, 0);
	assert_int_equal(dptp_layout_ngroups(&l, DPTP_GROUP_TP), 2);
	int g[8];
	assert_int_equal(dptp_layout_group_at(&l, DPTP_GROUP_DP, 1, g), 2);
	assert_int_equal(g[0], 1);
	assert_int_equal(g[1], 3);
}

static void test_dp4tp2(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 8, 4, 1, 2, NULL), 0);
	expect_group(&l, DPTP_GROUP_TP, 5, (int[]){4, 5}, 2, 1);
	expect_group(&l, DPTP_GROUP_DP, 5, (int[]){1, 3, 5, 7}, 4, 2);
	expect_group(&l, DPTP_GROUP_DP, 0, (int[]){0, 2, 4, 6}, 4, 0);
	expect_group(&l, DPTP_GROUP_EP, 7, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 7);
	assert_int_equal(dptp_layout_coord(&l, 6).dp, 3);
}

static void test_dp2tp4(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 8, 2, 1, 4, NULL), 0);
	expect_group(&l, DPTP_GROUP_TP, 6, (int[]){4, 5, 6, 7}, 4, 2);
	expect_group(&l, DPTP_GROUP_DP, 6, (int[]){2, 6}, 2, 1);
	expect_group(&l, DPTP_GROUP_DP, 1, (int[]){1, 5}, 2, 0);
	assert_int_equal(dptp_layout_ngroups(&l, DPTP_GROUP_DP), 4);
}

static void test_dp2pp2tp2(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 8, 2, 2, 2, NULL), 0);
	/* arange(8).reshape(2,2,2): [[[0,1],[2,3]],[[4,5],[6,7]]] */
	expect_group(&l, DPTP_GROUP_TP, 2, (int[]){2, 3}, 2, 0);
	expect_group(&l, DPTP_GROUP_PP, 1, (int[]){1, 3}, 2, 0);
	expect_group(&l, DPTP_GROUP_PP, 7, (int[]){5, 7}, 2, 1);
	expect_group(&l, DPTP_GROUP_DP, 3, (int[]){3, 7}, 2, 0);
	expect_group(&l, DPTP_GROUP_DP, 4, (int[]){0, 4}, 2, 1);
	expect_group(&l, DPTP_GROUP_EP, 6, (int[]){2, 3, 6, 7}, 4, 2);
	expect_group(&l, DPTP_GROUP_EP, 1, (int[]){0, 1, 4, 5}, 4, 1);
	struct dptp_coord c = dptp_layout_coord(&l, 6);
	assert_int_equal(c.dp, 1);
	assert_int_equal(c.pp, 1);
	assert_int_equal(c.tp, 0);
	assert_int_equal(dptp_layout_rank(&l, c), 6);
	assert_int_equal(dptp_layout_ngroups(&l, DPTP_GROUP_EP), 2);
}

static void test_dp1tp8(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 8, 0, 0, 8, NULL), 0);
	assert_int_equal(l.dp, 1);
	expect_group(&l, DPTP_GROUP_TP, 5, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 5);
	expect_group(&l, DPTP_GROUP_DP, 5, (int[]){5}, 1, 0);
	expect_group(&l, DPTP_GROUP_EP, 0, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 0);
}

static void test_dp8tp1(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 8, 8, 1, 1, NULL), 0);
	expect_group(&l, DPTP_GROUP_TP, 3, (int[]){3}, 1, 0);
	expect_group(&l, DPTP_GROUP_DP, 3, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 3);
	/* EP ranks coincide with DP ranks when tp == 1 */
	expect_group(&l, DPTP_GROUP_EP, 3, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 3);
}

static void test_mismatch_refused(void **state)
{
	struct dptp_layout l;
	struct dptp_err err = {0};
	assert_int_equal(dptp_layout_init(&l, 4, 2, 1, 4, &err), -22);
	assert_non_null(strstr(err.msg, "2*1*4 = 8"));
	assert_non_null(strstr(err.msg, "world size 4"));
	assert_int_equal(dptp_layout_init(&l, 6, 0, 0, 4, &err), -22);
	assert_non_null(strstr(err.msg, "not divisible"));
	assert_int_equal(dptp_layout_init(&l, 0, 0, 0, 0, &err), -22);
	/* products that overflow int are refused, never wrapped: 2642*2501*650
	 * is 2^32 + 4, and 65536*65536 wraps to 0 (a division by zero) */
	assert_int_equal(dptp_layout_init(&l, 4, 2642, 2501, 650, &err), -22);
	assert_non_null(strstr(err.msg, "2642*2501*650 is more than the world size 4"));
	assert_int_equal(dptp_layout_init(&l, 4, 0, 65536, 65536, &err), -22);
	assert_non_null(strstr(err.msg, "65536*65536 = 4294967296"));
	assert_int_equal(dptp_layout_init(&l, 4, 4, 2147483647, 2147483647, &err), -22);
	assert_int_equal(dptp_layout_init(&l, 4, 2147483647, 1, 1, &err), -22);
	assert_non_null(strstr(err.msg, "= 2147483647 does not match"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dp2tp2),
		cmocka_unit_test(test_dp4tp2),
		cmocka_unit_test(test_dp2tp4),
		cmocka_unit_test(test_dp2pp2tp2),
		cmocka_unit_test(test_dp1tp8),
		cmocka_unit_test(test_dp8tp1),
		cmocka_unit_test(test_mismatch_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
