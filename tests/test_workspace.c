/* The host workspace behind its ops table, on one rank: the fused allreduce
 * against the reference, the opId draw (fixed and bug 4's seeded one), and
 * the device choice (fixed and bug 3's tp_rank). Many ranks: test_dp2tp2. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "ipc/workspace.h"
#include "one_rank.h"

struct fixture {
	struct one_rank j;
	struct dptp_peer peers[1];
	struct dptp_ipc_job job;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (!f || one_rank_init(&f->j) < 0)
		return -1;
	f->peers[0] = (struct dptp_peer){ .pid = getpid(), .device = 5 };
	f->job = (struct dptp_ipc_job){ .x = &f->j.x, .rank = 0, .world = 1, .peers = f->peers, .tp_rank = 3,
					.seed = 77 };
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	one_rank_release(&f->j);
	free(f);
	return 0;
}

static void test_fused(void **state)
{
	struct fixture *f = *state;
	const struct dptp_ws_ops *ops = &dptp_ws_host_ops;
	enum { T = 4, H = 64, N = T * H };
	uint16_t x[N], res_in[N], gamma[H], res_out[N], norm_out[N], ref_res[N], ref_norm[N];
	float sum[N];
	for (int i = 0; i < N; i++) {
		x[i] = dptp_f32_to_bf16((float)(i % 7) - 3);
		res_in[i] = dptp_f32_to_bf16((float)(i % 5) * 0.5f);
		sum[i] = dptp_bf16_to_f32(x[i]);
	}
	for (int i = 0; i < H; i++)
		gamma[i] = dptp_f32_to_bf16(1 + (float)(i % 3));
	struct dptp_err err = {0};
	void *ws = NULL;
	assert_int_equal(ops->create(&ws, &f->job, &f->j.world, 0, 1, sizeof(x), DPTP_DTYPE_BF16, &err), 0);
	assert_non_null(ws);
	const char *algo = NULL;
	for (int call = 0; call < 4; call++) { /* every Lamport buffer, and around again */
		/* new inputs each call (what a buffer held before must not come
		 * back), a -0.0 among them (the "not written" mark's value) */
		for (int i = 0; i < N; i++) {
			x[i] = dptp_f32_to_bf16((float)((i + call) % 7) - 3);
			sum[i] = dptp_bf16_to_f32(x[i]);
		}
		x[call] = 0x8000;
		sum[call] = -0.0f;
		memset(res_out, 0, sizeof(res_out));
		assert_int_equal(ops->fused(ws, x, res_in, gamma, res_out, norm_out, T, H, 1e-6f,
					    dptp_now() + 10, &algo, &err), 0);
		dptp_residual_rmsnorm_ref(sum, res_in, gamma, ref_res, ref_norm, T, H, 1e-6f, DPTP_DTYPE_BF16);
		assert_memory_equal(res_out, ref_res, sizeof(res_out));
		assert_memory_equal(norm_out, ref_norm, sizeof(norm_out));
	}
	assert_string_equal(algo, "one-shot (Lamport)");
	assert_false(ops->alone);
	ops->destroy(ws);
	ops->destroy(NULL);
}

static void test_opid(void **state)
{
	struct fixture *f = *state;
	struct dptp_err err = {0};
	uint64_t a = 0, b = 0;
	assert_int_equal(dptp_opid_agree(&f->job, &f->j.world, 0, &a, &err), 0);
	assert_int_equal(dptp_opid_agree(&f->job, &f->j.world, 0, &b, &err), 0);
	assert_int_equal(a & 0xffff, 0);  /* low 16 bits: the global rank */
	assert_true(a != b);               /* OS entropy */
	f->job.opid_seeded = true;          /* bug 4 */
	assert_int_equal(dptp_opid_agree(&f->job, &f->j.world, 0, &a, &err), 0);
	assert_int_equal(dptp_opid_agree(&f->job, &f->j.world, 0, &b, &err), 0);
	assert_true(a == b && a == dptp_mix64(77));
}

static void test_device(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(dptp_workspace_device(&f->job), 5);
	f->job.device_from_tp_rank = true;  /* bug 3 */
	assert_int_equal(dptp_workspace_device(&f->job), 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_opid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_device, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
