/* Groups and the exchange backend's two root conversions: the coordinator's
 * to_global, and the backend's source rank with and without root_as_global
 * (bug 2). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plane/group.h"

static void dp2tp2(struct dptp_layout *l)
{
	struct dptp_err err = {0};
	assert_int_equal(dptp_layout_init(l, 4, 2, 1, 2, &err), 0);
}

static void test_init(void **state)
{
	struct dptp_layout l;
	dp2tp2(&l);
	struct dptp_group tp, dp, world;
	assert_int_equal(dptp_group_init(&tp, &l, DPTP_GROUP_TP, 3), 0);
	assert_int_equal(tp.size, 2);
	assert_int_equal(tp.ranks[0], 2);
	assert_int_equal(tp.ranks[1], 3);
	assert_int_equal(tp.index, 1);
	assert_int_equal(dptp_group_init(&dp, &l, DPTP_GROUP_DP, 3), 0);
	assert_int_equal(dp.ranks[0], 1);
	assert_int_equal(dp.ranks[1], 3);
	assert_int_equal(dptp_group_init(&world, &l, DPTP_GROUP_WORLD, 3), 0);
	assert_int_equal(world.size, 4);
	assert_int_equal(dptp_group_index_of(&tp, 2), 0);
	assert_int_equal(dptp_group_index_of(&tp, 0), -1);
	char s[64];
	dptp_group_format(&tp, s, sizeof(s));
	assert_string_equal(s, "[2, 3]");
	dptp_group_release(&tp);
	dptp_group_release(&tp); /* twice is fine */
	dptp_group_release(&dp);
	dptp_group_release(&world);
	dptp_group_release(NULL);
}

static void test_format_long(void **state)
{
	struct dptp_layout l;
	struct dptp_err err = {0};
	assert_int_equal(dptp_layout_init(&l, 16, 1, 1, 16, &err), 0);
	struct dptp_group g;
	assert_int_equal(dptp_group_init(&g, &l, DPTP_GROUP_TP, 0), 0);
	char s[128];
	dptp_group_format(&g, s, sizeof(s));
	assert_string_equal(s, "[0, 1, 2, 3, 4, 5, 6, 7, ..., 15]");
	char tiny[6];
	dptp_group_format(&g, tiny, sizeof(tiny)); /* truncated, terminated */
	assert_int_equal(strlen(tiny), 5);
	dptp_group_release(&g);
}

/* The coordinator's conversion: group-local index -> global rank. */
static void test_to_global(void **state)
{
	struct dptp_layout l;
	dp2tp2(&l);
	struct dptp_group tp;
	assert_int_equal(dptp_group_init(&tp, &l, DPTP_GROUP_TP, 2), 0);
	struct dptp_err err = {0};
	assert_int_equal(dptp_group_to_global(&tp, 0, &err), 2);
	assert_int_equal(dptp_group_to_global(&tp, 1, &err), 3);
	assert_string_equal(err.msg, "");
	assert_int_equal(dptp_group_to_global(&tp, 2, &err), -EINVAL);
	assert_string_equal(err.msg, "group rank 2 is out of range for group [2, 3]");
	assert_int_equal(dptp_group_to_global(&tp, -1, &err), -EINVAL);
	assert_string_equal(err.msg, "group rank -1 is out of range for group [2, 3]");
	dptp_group_release(&tp);
}

/* The exchange backend's conversion, both instances. */
static void test_root_src(void **state)
{
	struct dptp_layout l;
	dp2tp2(&l);
	struct dptp_group tp0, tp1;
	assert_int_equal(dptp_group_init(&tp0, &l, DPTP_GROUP_TP, 0), 0);
	assert_int_equal(dptp_group_init(&tp1, &l, DPTP_GROUP_TP, 2), 0);
	struct dptp_exchange good, buggy;
	dptp_exchange_init(&good, NULL, false);
	dptp_exchange_init(&buggy, NULL, true);
	assert_false(good.root_as_global);
	assert_true(buggy.root_as_global);
	for (int root = 0; root < 2; root++) {
		assert_int_equal(dptp_xchg_root_src(&good, &tp0, root), root);
		assert_int_equal(dptp_xchg_root_src(&good, &tp1, root), 2 + root);
		/* bug 2: the group-local root read as a global rank: harmless in
		 * replica 0, another replica's rank in replica 1 */
		assert_int_equal(dptp_xchg_root_src(&buggy, &tp0, root), root);
		assert_int_equal(dptp_xchg_root_src(&buggy, &tp1, root), root);
	}
	dptp_group_release(&tp0);
	dptp_group_release(&tp1);
}

/* torch's refusal, with its message, from the buggy backend (one rank: the
 * exchange round is this process's own). */
static void test_bcast_refused(void **state)
{
	struct dptp_bootstrap *b = NULL;
	struct dptp_err err = {0};
	assert_int_equal(dptp_bootstrap_single_create(&b, &err), 0);
	struct dptp_layout l;
	dp2tp2(&l);
	struct dptp_group tp1;
	assert_int_equal(dptp_group_init(&tp1, &l, DPTP_GROUP_TP, 2), 0);
	struct dptp_exchange buggy;
	dptp_exchange_init(&buggy, b, true);
	uint64_t v = 42;
	assert_int_equal(dptp_xchg_bcast_root(&buggy, &tp1, 0, &v, sizeof(v), &err), -EINVAL);
	assert_string_equal(err.msg, "global rank 0 is not part of group [2, 3]");
	assert_int_equal(v, 42);
	assert_int_equal(buggy.seq, 1); /* it still took its round (lockstep) */
	dptp_group_release(&tp1);
	dptp_bootstrap_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_format_long),
		cmocka_unit_test(test_to_global),
		cmocka_unit_test(test_root_src),
		cmocka_unit_test(test_bcast_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
