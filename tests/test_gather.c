/* Per-rank results: the wire form, and the merge into per-replica verdicts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "report/gather.h"
#include "plane/group.h"

static void test_pack_roundtrip(void **state)
{
	char hostile[300];
	for (int i = 0; i < 255; i++)
		hostile[i] = (char)(i + 1);
	hostile[255] = 0;
	struct dptp_check_result in[2] = {
		{ .name = "broadcast", .status = DPTP_FAIL, .seconds = 0.25, .detail = hostile },
		{ .name = "opid", .status = DPTP_TIMEOUT, .seconds = 1.5, .detail = NULL },
	};
	void *buf;
	size_t len;
	assert_int_equal(dptp_results_pack(in, 2, &buf, &len), 0);
	struct dptp_check_result out[2];
	assert_int_equal(dptp_results_unpack(buf, len, out, 2), 0);
	assert_string_equal(out[0].name, "broadcast");
	assert_int_equal(out[0].status, DPTP_FAIL);
	assert_string_equal(out[0].detail, hostile);
	assert_int_equal(out[1].status, DPTP_TIMEOUT);
	assert_string_equal(out[1].detail, "");
	free(out[0].detail);
	free(out[1].detail);
	/* truncated or with the wrong count: refused, never read past the end */
	for (size_t n = 0; n < len; n++)
		assert_int_equal(dptp_results_unpack(buf, n, out, 2) < 0 || n == len, 1);
	assert_true(dptp_results_unpack(buf, len, out, 3) < 0);
	free(buf);
}

static void test_merge_worst_of_replica(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 4, 2, 1, 2, NULL), 0);
	struct dptp_check_result r[4][1] = {
		{{ .name = "broadcast", .status = DPTP_PASS, .seconds = 0.1, .detail = "ok0" }},
		{{ .name = "broadcast", .status = DPTP_PASS, .seconds = 0.3, .detail = "ok1" }},
		{{ .name = "broadcast", .status = DPTP_PASS, .seconds = 0.1, .detail = "ok2" }},
		{{ .name = "broadcast", .status = DPTP_FAIL, .seconds = 0.2, .detail = "bad3" }},
	};
	struct dptp_check_result *rows[4] = { r[0], r[1], r[2], r[3] };
	struct dptp_report rep = {0};
	assert_int_equal(dptp_results_merge(&l, rows, 1, &rep), 0);
	assert_int_equal(rep.nreplicas, 2);
	assert_int_equal(rep.replicas[0].status, DPTP_PASS);
	assert_int_equal(rep.replicas[0].ranks[1], 1);
	assert_string_equal(rep.replicas[0].checks[0].detail, "rank 0: ok0");
	assert_true(rep.replicas[0].checks[0].seconds > 0.29);
	assert_int_equal(rep.replicas[1].status, DPTP_FAIL);
	assert_string_equal(rep.replicas[1].checks[0].detail, "rank 3: bad3");
	assert_int_equal(dptp_report_exit_code(&rep), 1);
	dptp_report_release(&rep);
}

static void test_to_global_refuses(void **state)
{
	struct dptp_layout l;
	assert_int_equal(dptp_layout_init(&l, 4, 2, 1, 2, NULL), 0);
	struct dptp_group g;
	assert_int_equal(dptp_group_init(&g, &l, DPTP_GROUP_TP, 3), 0);
	struct dptp_err err = {0};
	assert_int_equal(dptp_group_to_global(&g, 0, &err), 2);
	assert_int_equal(dptp_group_to_global(&g, 1, &err), 3);
	assert_true(dptp_group_to_global(&g, 2, &err) < 0);
	assert_non_null(strstr(err.msg, "[2, 3]"));
	assert_string_equal(err.msg, "group rank 2 is out of range for group [2, 3]");
	assert_int_equal(dptp_group_index_of(&g, 0), -1);
	dptp_group_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pack_roundtrip),
		cmocka_unit_test(test_merge_worst_of_replica),
		cmocka_unit_test(test_to_global_refuses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
