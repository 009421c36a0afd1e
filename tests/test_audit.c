/* dptp-run --audit: the record parser (lib/base/audit_rec.c) and the
 * analysis (launcher/audit/analyze/) on records written by hand, one
 * mechanism at a time, and healthy records with no finding. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "audit/audit_analyze.h"
#include "base/audit_rec.h"

static void test_parse(void **state)
{
	struct dptp_audit_rec r;
	const char *line = "{\"k\":\"op\",\"g\":[0, 2],\"n\":-1,\"t\":12.5,\"site\":\"a\\\"b\\u00e9:3\",\"async\":true,\"x\":null}";
	assert_int_equal(dptp_audit_rec_parse(line, strlen(line), &r), 0);
	assert_string_equal(dptp_audit_rec_str(&r, "k", ""), "op");
	const struct dptp_audit_field *g = dptp_audit_rec_get(&r, "g");
	assert_non_null(g);
	assert_int_equal(g->n, 2);
	assert_int_equal(g->a[1], 2);
	assert_int_equal(dptp_audit_rec_int(&r, "n", 0), -1);
	assert_true(dptp_audit_rec_get(&r, "t")->d == 12.5);
	assert_string_equal(dptp_audit_rec_str(&r, "site", ""), "a\"b\xc3\xa9:3");
	assert_int_equal(dptp_audit_rec_int(&r, "async", 0), 1);
	assert_false(dptp_audit_rec_has(&r, "x"));
	assert_false(dptp_audit_rec_has(&r, "missing"));
	dptp_audit_rec_release(&r);
	/* a torn record, a nested object, junk after the object */
	static const char *const bad[] = {"{\"k\":\"op\",\"g\":[0,", "{\"k\":{\"a\":1}}", "{\"k\":1} x", "[1]", ""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(dptp_audit_rec_parse(bad[i], strlen(bad[i]), &r), -EINVAL);
		dptp_audit_rec_release(&r);
	}
}

/* ---- a job's audit folder, written by hand -------------------------- */

static char dir[64];

static int setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/test_audit_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	dptp_rm_tree(dir);
	return 0;
}

__attribute__((format(printf, 3, 4)))
static void rec(int rank, const char *kind, const char *fmt, ...)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/a0.p%d.%s.jsonl", dir, 1000 + rank, kind);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

/* DP2TP2: every rank says hello, makes the TP and DP groups */
static void job(int world)
{
	for (int r = 0; r < world; r++) {
		rec(r, "py", "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":%d,\"world\":%d,\"local_rank\":%d,\"pid\":%d,\"host\":\"h\",\"att\":0,\"worker\":true}",
			r, world, r, 1000 + r);
		rec(r, "py", "{\"k\":\"world\",\"id\":\"h:29500\",\"size\":%d,\"rank\":%d,\"backend\":\"gloo\",\"timeout\":1800,\"t\":0.5}", world, r);
		rec(r, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:1\"}", r / 2 * 2, r / 2 * 2 + 1);
		rec(r, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:2\"}", r % 2, r % 2 + 2);
	}
}

static struct audit_report rep;

/* the job's first world */
static void analyze(struct audit_result *res, bool hung)
{
	struct dptp_err err = {0};
	assert_int_equal(audit_analyze_job(dir, NULL, hung ? 0 : -1, &rep, &err), 0);
	assert_true(rep.nw >= 1);
	*res = rep.w[0];
}

static void done(void)
{
	audit_report_release(&rep);
}

static void test_healthy(void **state)
{
	struct audit_result res;
	job(4);
	for (int r = 0; r < 4; r++) {
		int tp0 = r / 2 * 2;
		rec(r, "py", "{\"k\":\"op\",\"op\":\"broadcast\",\"g\":[0,1,2,3],\"gn\":0,\"seq\":1,\"n\":4,\"src\":0,\"dt\":\"float32\",\"site\":\"m.py:5\",\"t\":1}");
		rec(r, "py", "{\"k\":\"op\",\"op\":\"broadcast\",\"g\":[%d,%d],\"gn\":0,\"seq\":1,\"n\":1,\"src\":%d,\"site\":\"m.py:6\",\"t\":2}", tp0, tp0 + 1, tp0);
		for (int idx = 0; idx < 2; idx++)
			rec(r, "py", "{\"k\":\"op\",\"op\":\"broadcast\",\"g\":[%d,%d],\"gn\":0,\"seq\":%d,\"n\":4,\"src\":%d,\"site\":\"m.py:7\",\"t\":3}",
				r % 2, r % 2 + 2, idx + 1, r % 2 + 2 * idx);
		/* p2p inside the TP group, global peers */
		rec(r, "py", "{\"k\":\"op\",\"op\":\"%s\",\"g\":[0,1,2,3],\"gn\":0,\"seq\":2,\"n\":4,\"%s\":%d,\"site\":\"m.py:8\",\"t\":4}",
			r % 2 ? "recv" : "send", r % 2 ? "src" : "dst", r % 2 ? tp0 : tp0 + 1);
		rec(r, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"@ws-%d\",\"rc\":0,\"err\":0,\"t\":5}", r);
		rec(r, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/seg-%d\",\"fl\":%d,\"rc\":3,\"err\":0,\"t\":5}", tp0, 0100 | 02);
		rec(r, "py", "{\"k\":\"dev\",\"dev\":%d,\"how\":\"set_device\",\"site\":\"m.py:9\"}", r);
		rec(r, "py", "{\"k\":\"exit\",\"t\":9}");
	}
	analyze(&res, false);
	assert_true(res.layout_known);
	assert_int_equal(res.layout.dp, 2);
	assert_int_equal(res.layout.tp, 2);
	for (size_t i = 0; i < res.nf; i++)
		print_message("# unexpected: %c %s\n", res.f[i].mech, res.f[i].detail);
	assert_int_equal(res.nf, 0);
	done();
}

/* NCCL's RAS port, bound from inside libnccl by every process (the
 * preload marks such a bind "by":"nccl"): no finding; the same binds made
 * by the program are the I/C finding they always were. */
static void nccl_ras_job(bool by_nccl)
{
	job(4);
	for (int r = 0; r < 4; r++) {
		rec(r, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"inet\",\"addr\":\"127.0.0.1\",\"port\":28028,"
			"\"rc\":%d,\"err\":%d%s,\"t\":%d}", r ? -1 : 0, r ? 98 : 0, by_nccl ? ",\"by\":\"nccl\"" : "", 1 + r);
		rec(r, "py", "{\"k\":\"exit\",\"t\":9}");
	}
}

static void test_nccl_own_port(void **state)
{
	struct audit_result res;
	(void)state;
	nccl_ras_job(true);
	analyze(&res, false);
	for (size_t i = 0; i < res.nf; i++)
		print_message("# unexpected: %c %s\n", res.f[i].mech, res.f[i].detail);
	assert_int_equal(res.nf, 0);
	done();
}

static void test_nccl_own_port_by_program(void **state)
{
	struct audit_result res;
	(void)state;
	nccl_ras_job(false);
	analyze(&res, false);
	assert_true(res.nf >= 1);
	assert_true(res.f[0].mech == 'I' || res.f[0].mech == 'C');
	assert_non_null(strstr(res.f[0].detail, "28028"));
	done();
}

static void test_p_size(void **state)
{
	struct audit_result res;
	job(4);
	/* vLLM PR 25906: a buffer sized from the local token count */
	for (int r = 0; r < 4; r++)
		rec(r, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[%d,%d],\"gn\":0,\"seq\":1,\"n\":%d,\"dt\":\"bfloat16\",\"site\":\"m.py:5\",\"t\":1}",
			r % 2, r % 2 + 2, r >= 2 ? 6 : 8);
	analyze(&res, false);
	assert_int_equal(res.nf, 2); /* one per DP group, no majority in either */
	assert_int_equal(res.f[0].mech, 'P');
	assert_int_equal(res.f[0].nreplicas, 2);
	assert_non_null(strstr(res.f[0].detail, "n=6"));
	done();
}

static void test_p_missing(void **state)
{
	struct audit_result res;
	job(4);
	/* vLLM issue 43547: replica 1 skips the DP all-reduce and exits */
	for (int r = 0; r < 4; r++) {
		if (r < 2)
			rec(r, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[%d,%d],\"gn\":0,\"seq\":1,\"n\":1,\"site\":\"m.py:5\",\"t\":1}",
				r % 2, r % 2 + 2);
		else
			rec(r, "py", "{\"k\":\"exit\",\"t\":2}");
	}
	analyze(&res, false);
	assert_int_equal(res.nf, 2);
	assert_int_equal(res.f[0].mech, 'P');
	assert_int_equal(res.f[0].ranks[0], 2);
	assert_int_equal(res.f[0].replicas[0], 1);
	assert_non_null(strstr(res.f[0].detail, "never entered all_reduce"));
	done();
}

static void test_r_twin(void **state)
{
	struct audit_result res;
	job(4);
	/* vLLM PR 2528's kind: the group-local peer 1 sent to as a global rank */
	for (int r = 0; r < 4; r += 2)
		rec(r, "py", "{\"k\":\"op\",\"op\":\"send\",\"g\":[0,1,2,3],\"gn\":0,\"seq\":1,\"n\":4,\"dst\":1,\"site\":\"m.py:5\",\"t\":1}");
	analyze(&res, false);
	assert_int_equal(res.nf, 1);
	assert_int_equal(res.f[0].mech, 'R');
	assert_int_equal(res.f[0].nranks, 1);
	assert_int_equal(res.f[0].ranks[0], 2);
	done();
}

static void test_g_cross(void **state)
{
	struct audit_result res;
	job(4);
	/* a per-replica segment and socket used by the other replica */
	rec(0, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/ws\",\"fl\":%d,\"rc\":3,\"err\":0,\"t\":1}", 0100 | 0200 | 02);
	rec(2, "c", "{\"k\":\"shm\",\"call\":\"open\",\"name\":\"/dev/shm/ws\",\"fl\":2,\"rc\":3,\"err\":0,\"t\":2}");
	rec(1, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"/tmp/s1\",\"rc\":0,\"err\":0,\"t\":1}");
	rec(3, "c", "{\"k\":\"sock\",\"call\":\"connect\",\"fam\":\"unix\",\"addr\":\"/tmp/s1\",\"rc\":0,\"err\":0,\"t\":2}");
	analyze(&res, false);
	assert_int_equal(res.nf, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(res.f[i].mech, 'G');
		assert_int_equal(res.f[i].replicas[0], 1);
	}
	done();
}

static void test_nccl(void **state)
{
	struct audit_result res;
	/* a C++ program over NCCL: two TP communicators of DP2TP2; replica 1
	 * all-reduces a buffer of another size (P), replica 0 broadcasts from
	 * communicator rank 5 of 2 (R), and a healthy all-gather */
	for (int r = 0; r < 4; r++) {
		rec(r, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":%d,\"world\":4,\"local_rank\":%d,\"pid\":1,\"host\":\"h\",\"worker\":true}", r, r);
		rec(r, "c", "{\"k\":\"nccl\",\"call\":\"init\",\"id\":\"%016x\",\"nranks\":2,\"crank\":%d,\"dev\":%d,\"rc\":0}",
			0xa0 + r / 2, r % 2, r);
		rec(r, "c", "{\"k\":\"nccl\",\"call\":\"op\",\"op\":\"all_gather\",\"id\":\"%016x\",\"n\":64,\"dt\":7,\"rc\":0}", 0xa0 + r / 2);
		rec(r, "c", "{\"k\":\"nccl\",\"call\":\"op\",\"op\":\"all_reduce\",\"id\":\"%016x\",\"n\":%d,\"dt\":7,\"rc\":0}",
			0xa0 + r / 2, r == 3 ? 32 : 64);
		if (r < 2)
			rec(r, "c", "{\"k\":\"nccl\",\"call\":\"op\",\"op\":\"broadcast\",\"id\":\"%016x\",\"n\":8,\"dt\":7,\"root\":5,\"rc\":0}",
				0xa0);
	}
	analyze(&res, false);
	assert_true(res.layout_known);
	assert_int_equal(res.layout.tp, 2);
	assert_int_equal(res.nf, 2);
	assert_int_equal(res.f[0].mech, 'P');
	assert_int_equal(res.f[0].nreplicas, 1);
	assert_int_equal(res.f[0].replicas[0], 1);
	assert_int_equal(res.f[1].mech, 'R');
	assert_int_equal(res.f[1].replicas[0], 0);
	done();
}

/* D: a device from another coordinate than LOCAL_RANK (the TP rank) */
static void test_d(void **state)
{
	struct audit_result res;
	job(4);
	for (int r = 0; r < 4; r++) {
		rec(r, "py", "{\"k\":\"dev\",\"dev\":%d,\"how\":\"set_device\",\"site\":\"m.py:9\"}", r % 2);
		rec(r, "py", "{\"k\":\"exit\",\"t\":9}");
	}
	analyze(&res, false);
	assert_int_equal(res.nf, 1);
	assert_int_equal(res.f[0].mech, 'D');
	assert_int_equal(res.f[0].nranks, 2);
	assert_int_equal(res.f[0].ranks[0], 2);
	assert_string_equal(res.f[0].site, "m.py:9");
	assert_non_null(strstr(res.f[0].detail, "rank 2 (LOCAL_RANK 2) selected cuda:0, the device of rank 0 too"));
	done();
}

static void test_layout(void **state)
{
	struct audit_result res;
	/* no subgroup: every rank its own replica */
	for (int r = 0; r < 2; r++)
		rec(r, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":%d,\"world\":2,\"local_rank\":%d,\"pid\":1,\"host\":\"h\",\"worker\":true}", r, r);
	analyze(&res, false);
	assert_true(res.layout_known);
	assert_int_equal(res.layout.dp, 2);
	assert_int_equal(res.nf, 0);
	done();
	/* a subgroup that is no TP/PP/DP/EP group of any layout */
	rec(0, "py", "{\"k\":\"world\",\"id\":\"h:1\",\"size\":4,\"rank\":0}");
	rec(0, "py", "{\"k\":\"group\",\"g\":[0,3],\"gn\":0,\"site\":\"m.py:1\"}");
	analyze(&res, false);
	/* rank 0's world of 4; the launcher's world (rank 1) has nothing to analyse */
	assert_int_equal(rep.nw, 1);
	assert_string_equal(res.world_id, "h:1");
	assert_false(res.layout_known);
	assert_non_null(strstr(res.layout_how, "could not be inferred"));
	done();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test_setup_teardown(test_healthy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl_own_port, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl_own_port_by_program, setup, teardown),
		cmocka_unit_test_setup_teardown(test_p_size, setup, teardown),
		cmocka_unit_test_setup_teardown(test_p_missing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_r_twin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_g_cross, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl, setup, teardown),
		cmocka_unit_test_setup_teardown(test_d, setup, teardown),
		cmocka_unit_test_setup_teardown(test_layout, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
