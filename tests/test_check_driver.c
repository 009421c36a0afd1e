/* The check driver (lib/checks/check.c) with made-up checks on one rank,
 * the registry, and the real checks through the driver on one rank. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "checks/check.h"
#include "checks/ctx.h"

struct fixture {
	struct dptp_bootstrap *b;
	struct dptp_ctx c;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct dptp_err err = {0};
	struct dptp_params p = { .tokens = 8, .hidden = 64, .dtype = DPTP_DTYPE_BF16, .seed = 1,
				 .eps = 1e-6, .timeout = 5 };
	if (!f || dptp_bootstrap_single_create(&f->b, &err) < 0 || dptp_ctx_init(&f->c, f->b, &p, &err) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	dptp_ctx_release(&f->c);
	dptp_bootstrap_destroy(f->b);
	free(f);
	return 0;
}

static int nprepare, nrun, nverify, nrelease, fail_round;

static void reset(int fail_at)
{
	nprepare = nrun = nverify = nrelease = 0;
	fail_round = fail_at;
}

struct st { int value; };

static const char *skip_always(const struct dptp_ctx *c) { return "nothing to test here"; }
static int prepare_ok(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	nprepare++;
	((struct st *)state)->value = 41;
	return 0;
}
static int prepare_fails(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	nprepare++;
	return dptp_err_set(err, -ENOMEM, "no room for the inputs");
}
static void run_step(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	nrun++;
	assert_int_equal(((struct st *)state)->value, 41 + round);
	((struct st *)state)->value++;
	assert_true(c->x.deadline > dptp_now() && c->x.deadline <= dptp_now() + 3.5);
}
static void verify_step(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	nverify++;
	if (round == fail_round)
		dptp_result_set(res, DPTP_FAIL, "round %d is wrong", round);
}
static void release_step(struct dptp_ctx *c, void *state) { nrelease++; }

static const struct dptp_check skipper = {
	.name = "skipper", .skip = skip_always, .run = run_step, .release = release_step,
};
static const struct dptp_check rounds = {
	.name = "rounds", .state_size = sizeof(struct st), .prepare = prepare_ok, .rounds = 3,
	.run = run_step, .verify = verify_step, .release = release_step,
};
static const struct dptp_check bad_prepare = {
	.name = "bad-prepare", .state_size = sizeof(struct st), .prepare = prepare_fails,
	.run = run_step, .verify = verify_step, .release = release_step,
};

static void test_skip(void **state)
{
	struct fixture *f = *state;
	struct dptp_check_result r = {0};
	reset(-1);
	dptp_check_run(&skipper, &f->c, 3, &r);
	assert_string_equal(r.name, "skipper");
	assert_int_equal(r.status, DPTP_SKIP);
	assert_string_equal(r.detail, "nothing to test here");
	assert_int_equal(nrun + nrelease, 0);
	free(r.detail);
}

static void test_rounds(void **state)
{
	struct fixture *f = *state;
	struct dptp_check_result r = {0};
	reset(-1);
	dptp_check_run(&rounds, &f->c, 3, &r);
	assert_int_equal(r.status, DPTP_PASS);
	assert_string_equal(r.detail, ""); /* never NULL */
	assert_true(r.seconds >= 0);
	assert_int_equal(nprepare, 1);
	assert_int_equal(nrun, 3);
	assert_int_equal(nverify, 3);
	assert_int_equal(nrelease, 1);
	free(r.detail);

	/* stops after the first round that fails */
	memset(&r, 0, sizeof(r));
	reset(1);
	dptp_check_run(&rounds, &f->c, 3, &r);
	assert_int_equal(r.status, DPTP_FAIL);
	assert_string_equal(r.detail, "round 1 is wrong");
	assert_int_equal(nrun, 2);
	assert_int_equal(nverify, 2);
	assert_int_equal(nrelease, 1);
	free(r.detail);
}

static void test_prepare_fails(void **state)
{
	struct fixture *f = *state;
	struct dptp_check_result r = {0};
	reset(-1);
	uint64_t seq = f->c.x.seq;
	dptp_check_run(&bad_prepare, &f->c, 3, &r);
	assert_int_equal(r.status, DPTP_ERROR);
	assert_string_equal(r.detail, "preparing the inputs: no room for the inputs");
	assert_int_equal(nrun, 0);
	assert_int_equal(nrelease, 1);
	assert_int_equal(f->c.x.seq, seq + 1); /* the outcome was shared (one round) */
	free(r.detail);
}

static void test_broken(void **state)
{
	struct fixture *f = *state;
	struct dptp_check_result r = {0};
	reset(-1);
	f->c.x.broken = true;
	dptp_check_run(&rounds, &f->c, 3, &r);
	assert_int_equal(r.status, DPTP_SKIP);
	assert_string_equal(r.detail, "not run: an earlier check timed out");
	assert_int_equal(nprepare + nrun + nrelease, 0);
	free(r.detail);
}

static void test_result_helpers(void **state)
{
	struct dptp_check_result r = { .status = DPTP_PASS };
	struct dptp_err err = {0};
	dptp_err_set(&err, -EIO, "the wire broke");
	dptp_result_fail(&r, DPTP_FAIL, -EIO, &err, "sending");
	assert_int_equal(r.status, DPTP_FAIL);
	assert_string_equal(r.detail, "sending: the wire broke");
	dptp_result_fail(&r, DPTP_FAIL, -ETIMEDOUT, NULL, "later"); /* first problem kept */
	assert_string_equal(r.detail, "sending: the wire broke");
	dptp_result_append(&r, "; %d more", 2);
	assert_string_equal(r.detail, "sending: the wire broke; 2 more");
	struct dptp_check_result t = { .status = DPTP_PASS };
	dptp_result_fail(&t, DPTP_FAIL, -ETIMEDOUT, NULL, "waiting");
	assert_int_equal(t.status, DPTP_TIMEOUT);
	assert_string_equal(t.detail, "waiting: Connection timed out");
	free(r.detail);
	free(t.detail);
}

static void test_registry(void **state)
{
	assert_true(dptp_nchecks >= 5 && dptp_nchecks <= DPTP_MAX_CHECKS);
	for (int i = 0; i < dptp_nchecks; i++) {
		const struct dptp_check *k = dptp_checks[i];
		assert_non_null(k->name);
		assert_non_null(k->summary);
		assert_non_null(k->run);
		assert_int_equal(dptp_check_lookup(k->name), i);
		assert_string_equal(dptp_check_name(i), k->name);
	}
	assert_int_equal(dptp_check_lookup("nope"), -1);
	assert_null(dptp_check_name(dptp_nchecks));
	assert_null(dptp_check_name(-1));
	/* DESIGN.md's names, in report order */
	static const char *const design[] = { "broadcast", "opid", "device-map", "fused-allreduce", "dispatch" };
	for (int i = 0; i < 5; i++)
		assert_true(dptp_check_lookup(design[i]) >= 0);
	for (int i = 1; i < 5; i++)
		assert_true(dptp_check_lookup(design[i - 1]) < dptp_check_lookup(design[i]));
}

/* Every real check through the driver on one rank of the host backend. */
static void test_real_checks(void **state)
{
	struct fixture *f = *state;
	for (int i = 0; i < dptp_nchecks; i++) {
		struct dptp_check_result r = {0};
		dptp_check_run(dptp_checks[i], &f->c, 5, &r);
		const char *n = dptp_checks[i]->name;
		if (strcmp(n, "broadcast") == 0 || strcmp(n, "opid") == 0)
			assert_int_equal(r.status, DPTP_SKIP); /* no group of two */
		else if (r.status != DPTP_PASS && r.status != DPTP_SKIP)
			fail_msg("%s: %s: %s", n, dptp_status_name(r.status), r.detail);
		free(r.detail);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_skip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prepare_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_broken, setup, teardown),
		cmocka_unit_test(test_result_helpers),
		cmocka_unit_test(test_registry),
		cmocka_unit_test_setup_teardown(test_real_checks, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
