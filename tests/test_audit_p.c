/* dptp-run --audit, mechanism P (launcher/audit/analyze/p.c): sequences that
 * disagree, a rank that left before a collective its peers entered (as the
 * launcher saw it), counts past the cap, and the hang: the replica behind
 * on a group, the same on every run, and the hang watch's verdict. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "audit_records.h"
#include "audit/analyze/model.h"
#include "base/audit_rec.h"

static int seqs[1100][8]; /* per pid - 1000, per group slot: calls so far */

static void op(int r, const char *name, int g0, int g1, int slot, int line, double t, bool done)
{
	int seq = ++seqs[r][slot];
	char g[32];
	if (g1 < 0)
		snprintf(g, sizeof(g), "0,1,2,3");
	else
		snprintf(g, sizeof(g), "%d,%d", g0, g1);
	arec(1000 + r, "py", "{\"k\":\"op\",\"op\":\"%s\",\"g\":[%s],\"gn\":0,\"seq\":%d,\"n\":1,\"site\":\"x.py:%d\",\"t\":%.3f}",
		name, g, seq, line, t);
	if (done)
		arec(1000 + r, "py", "{\"k\":\"done\",\"g\":[%s],\"gn\":0,\"seq\":%d,\"t\":%.3f}", g, seq, t + 0.001);
}

/* issue 31's skipped loop step: replica 1 skips the DP all-reduce of step 0
 * (`if n == 0: continue`), its DP peers' all-reduces match one step off, and
 * the job hangs: replica 0 in its last all-reduce, replica 1 at the final
 * barrier. early: replica 1 reached the barrier before replica 0 entered its
 * last all-reduce (the order of the two varies from run to run). */
static void skipped_step(bool early)
{
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 4; r++) {
		arec_rank(r, 4);
		arec_launcher("{\"k\":\"wstart\",\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"att\":0,\"t\":0}", r, r, 1000 + r);
		int rep = r / 2, dp0 = r % 2, steps = 3;
		double t = 1;
		for (int n = 0; n < steps; n++) {
			op(r, "all_reduce", r / 2 * 2, r / 2 * 2 + 1, 1, 6, t, true); /* TP, every step */
			t += 1;
			if (rep == 1 && n == 0)
				continue;
			bool last = rep == 0 && n == steps - 1;
			op(r, "all_reduce", dp0, dp0 + 2, 2, 7, last ? (early ? 20 : 10) : t, !last);
			t += 1;
		}
		if (rep == 1)
			op(r, "barrier", 0, -1, 0, 9, early ? 10 : 20, false);
	}
	arec_launcher("{\"k\":\"hang\",\"att\":0,\"t\":50,\"msg\":\"x\"}");
	for (int r = 0; r < 4; r++) /* ended by the watch */
		arec_launcher("{\"k\":\"wexit\",\"rank\":%d,\"pid\":%d,\"att\":0,\"code\":null,\"sig\":9,\"core\":false,\"t\":51}", r,
			1000 + r);
}

static void check_skipped_step(void)
{
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	const struct audit_result *w = &arec_rep.w[0];
	assert_int_equal(w->nf, 2); /* one per DP group, both replica 1 */
	for (size_t i = 0; i < w->nf; i++) {
		const struct audit_finding *f = &w->f[i];
		assert_int_equal(f->mech, 'P');
		assert_int_equal(f->nreplicas, 1);
		assert_int_equal(f->replicas[0], 1);
		assert_string_equal(f->site, "x.py:7");
		assert_int_equal(f->nranks, 1);
		char want[128];
		snprintf(want, sizeof(want), "rank %d entered 2 all_reduce on group [%d,%d] at x.py:7, rank %d entered 3", 2 + (int)i,
			(int)i, 2 + (int)i, (int)i);
		assert_non_null(strstr(f->detail, want));
		/* the last calls of each member, side by side */
		assert_int_equal(f->ntrail, 2);
		assert_int_equal(f->trail[0].rank, (int)i);
		assert_true(f->trail[0].n >= 2);
		assert_true(f->trail[0].c[f->trail[0].n - 1].open);
		assert_string_equal(f->trail[0].c[f->trail[0].n - 1].op, "all_reduce");
		assert_int_equal(f->trail[0].c[f->trail[0].n - 1].seq, 3);
		assert_string_equal(f->trail[1].c[f->trail[1].n - 1].op, "barrier");
	}
}

static void test_skipped_step_hang(void **state)
{
	(void)state;
	skipped_step(false);
	arec_analyze(0);
	check_skipped_step();
	/* the watch's own view: the same replica, with the counts */
	char msg[1024];
	pid_t pids[16];
	size_t npids;
	int att;
	assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 1);
	assert_non_null(strstr(msg, "rank 2 entered 2 all_reduce on group [0,2] at x.py:7, rank 0 entered 3: replica 1 is behind"));
}

static void test_skipped_step_other_order(void **state)
{
	(void)state;
	skipped_step(true);
	arec_analyze(0);
	check_skipped_step();
}

/* the watch: a hang only when every live rank waits inside a collective */
static void test_pending(void **state)
{
	(void)state;
	char msg[1024];
	pid_t pids[16];
	size_t npids;
	int att;
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		arec_launcher("{\"k\":\"wstart\",\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"att\":0,\"t\":0}", r, r, 1000 + r);
		op(r, "all_reduce", 0, 1, 0, 5, 1, true);
	}
	/* a helper of rank 0 that ended without an end record: its pid is no
	 * longer this job's (no DPTP_AUDIT_DIR of this folder there) */
	arec(3000, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":0,\"world\":2,\"local_rank\":0,\"pid\":3000,\"ppid\":1000,\"worker\":false,\"py\":false,\"img\":0,\"host\":\"h\",\"att\":0}");
	/* rank 0 checkpoints (no collective open), rank 1 waits in the barrier */
	op(1, "barrier", 0, 1, 0, 8, 2, false);
	assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 0);
	assert_int_equal(npids, 2);
	/* rank 0 now waits in an all-reduce where rank 1 waits in the barrier */
	op(0, "all_reduce", 0, 1, 0, 5, 3, false);
	assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 1);
	print_message("# %s\n", msg);
	assert_non_null(strstr(msg, "call #2 on group [0,1]: rank 0 waits in all_reduce(n=1) at x.py:5, rank 1 in barrier"));
	assert_int_equal(att, 0);
	/* rank 0 enters a third: rank 1 is behind, by a step rank 0 never took */
	op(0, "all_reduce", 0, 1, 0, 5, 4, false);
	assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 1);
	print_message("# %s\n", msg);
	assert_non_null(strstr(msg, "rank 1 entered 1 all_reduce on group [0,1] at x.py:5, rank 0 entered 3"));
	/* rank 1 ends: it left, rank 0 waits for it */
	arec_end(1);
	assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 1);
	assert_non_null(strstr(msg, "rank 1 exited after it entered 1 all_reduce"));
	assert_int_equal(npids, 1);
	assert_int_equal(pids[0], 1000);
	/* a live helper of this job (its environment names the folder) is ended too */
	char env[128];
	snprintf(env, sizeof(env), "DPTP_AUDIT_DIR=%s", arec_dir);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		char *const argv[] = {"sleep", "30", NULL}, *const envp[] = {env, NULL};
		execve("/bin/sleep", argv, envp);
		_exit(127);
	}
	arec((int)child, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":0,\"world\":2,\"local_rank\":0,\"pid\":%d,\"ppid\":1000,\"worker\":false,\"py\":false,\"img\":0,\"host\":\"h\",\"att\":0}",
		(int)child);
	bool seen = false;
	for (int tries = 0; tries < 200 && !seen; tries++) { /* until the exec is done */
		assert_int_equal(audit_analyze_pending(arec_dir, msg, sizeof(msg), pids, &npids, 16, &att), 1);
		for (size_t i = 0; i < npids; i++)
			seen |= pids[i] == child;
		if (!seen)
			usleep(10000);
	}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	assert_true(seen);
}

/* issue 30 item 4: a rank that leaves by os._exit (no atexit) or a signal
 * before a barrier its peer entered is P, named with how it ended */
static void test_exit_before_collective(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		arec_launcher("{\"k\":\"wstart\",\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"att\":0,\"t\":0}", r, r, 1000 + r);
		op(r, "all_reduce", 0, 1, 0, 5, 1, true);
	}
	op(0, "barrier", 0, 1, 0, 8, 2, false);
	/* rank 1: no end record of its own, the launcher saw it killed */
	arec_launcher("{\"k\":\"wexit\",\"rank\":1,\"pid\":1001,\"att\":0,\"code\":null,\"sig\":11,\"core\":true,\"t\":3}");
	arec_launcher("{\"k\":\"wexit\",\"rank\":0,\"pid\":1000,\"att\":0,\"code\":1,\"sig\":null,\"core\":false,\"t\":9}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_int_equal(arec_rep.w[0].f[0].ranks[0], 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "rank 1 never entered barrier"));
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "signal 11, core dumped"));
	assert_int_equal(arec_rep.nexits, 2);
	assert_int_equal(arec_rep.exits[0].sig, 11);
	assert_true(arec_rep.exits[0].core);
	assert_int_equal(arec_rep.exits[0].rank, 1);
}

/* os._exit: the C recorder's end record ("_exit"), no launcher file */
static void test_os_exit(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 2; r++)
		arec_rank(r, 2);
	op(0, "barrier", 0, 1, 0, 8, 2, false);
	arec(1001, "c", "{\"k\":\"end\",\"how\":\"_exit\",\"code\":0,\"records\":2,\"lost\":0,\"t\":3}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_int_equal(arec_rep.w[0].f[0].ranks[0], 1);
}

/* past the cap the calls are counted, not kept: differing counts are P, the
 * cap a gap */
static void test_cap_counts(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		for (int i = 0; i < 3; i++)
			op(r, "all_reduce", 0, 1, 0, 5, 1 + i, true);
		arec(1000 + r, "py", "{\"k\":\"cap\",\"max\":3,\"t\":4}");
		arec(1000 + r, "py", "{\"k\":\"count\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"t\":5}", r ? 19999 : 20000);
		arec_end(r);
	}
	arec_analyze(-1);
	arec_print();
	assert_true(arec_rep.w[0].capped);
	assert_true(arec_gap(0, "record cap (3)"));
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "rank 1 made 19999 collectives on group [0,1], rank 0 made 20000"));
}

/* the contract's test vectors (amendment 08:25) for the term of a call */
static void test_term_vectors(void **state)
{
	(void)state;
	bool none[R_N] = {false}, src[R_N] = {true, false, false, false};
	int64_t root[R_N] = {1, -1, -1, -1};
	assert_true(sig_hash("all_reduce|4|float32|") == 0x7a47326087b79594ull);
	assert_true(sig_hash("broadcast|8|float32|src=1") == 0xb971f08fe4c43863ull);
	assert_true(sig_hash("barrier|-1||") == 0x146f9915e792c06eull);
	assert_true(op_term("all_reduce", 4, "float32", none, root, 0) == 0xaac1b457afeb267cull);
	assert_true(op_term("all_reduce", 4, "float32", none, root, 1) == 0x8e2fa50c80192a79ull);
	assert_true(op_term("broadcast", 8, "float32", src, root, 3) == 0x5ba63920bf89ce99ull);
	assert_true(op_term("barrier", -1, "", none, root, 2) == 0x7f21225753343a58ull);
}

/* 3 all_reduce(n=1) recorded, then the cap: a count of `total` calls and the
 * sum of the terms of the unkept ones, all_reduce(n=1) except from position
 * `from` on, where they are all_reduce(n=n2) */
static void capped_rank(int r, int total, int from, int n2, bool hs)
{
	bool none[R_N] = {false};
	int64_t root[R_N] = {-1, -1, -1, -1};
	uint64_t sum = 0;
	arec_rank(r, 2);
	for (int i = 0; i < 3; i++)
		op(r, "all_reduce", 0, 1, 0, 5, 1 + i, true);
	arec(1000 + r, "py", "{\"k\":\"cap\",\"max\":3,\"t\":4}");
	for (int pos = 3; pos < total; pos++)
		sum += op_term("all_reduce", pos >= from ? n2 : 1, "", none, root, pos);
	if (hs)
		arec(1000 + r, "py", "{\"k\":\"count\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"hs\":\"%016llx\",\"t\":5}", total,
			(unsigned long long)sum);
	else
		arec(1000 + r, "py", "{\"k\":\"count\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"t\":5}", total);
	arec(1000 + r, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":%d,\"dropped\":%d,\"t\":99}",
		2 * (total - 3), 2 * (total - 3));
	arec(1000 + r, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":0,\"records\":3,\"lost\":0,\"t\":99.5}");
}

/* past the cap, the same calls on every rank: compared by count and sum,
 * no gap, a pass */
static void test_cap_sums_equal(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	capped_rank(0, 5000, 5000, 1, true);
	capped_rank(1, 5000, 5000, 1, true);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
	assert_false(arec_rep.w[0].capped);
}

/* past the cap, rank 1 changes its tensor's size: P, naming the group */
static void test_cap_sums_differ(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	capped_rank(0, 5000, 5000, 1, true);
	capped_rank(1, 5000, 4000, 2, true);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail,
		"calls past the record cap differ in op/size/dtype/root on group [0,1]: rank 1 vs rank 0"));
	assert_int_equal(arec_rep.w[0].f[0].nranks, 1);
	assert_int_equal(arec_rep.w[0].f[0].ranks[0], 1);
}

/* a rank whose count has no sum: its calls past the cap stay uncompared */
static void test_cap_sum_missing(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	capped_rank(0, 5000, 5000, 1, true);
	capped_rank(1, 5000, 5000, 1, false);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_true(arec_rep.w[0].capped);
	assert_true(arec_gap(0, "record cap (3) was reached in pid 1000"));
	assert_true(arec_gap(0, "record cap (3) was reached in pid 1001"));
	assert_false(arec_gap(0, "lost"));
}

/* A C++ program over NCCL, past the C recorder's cap: 3 all_reduce(n=64)
 * recorded, then `total` in all counted with the sum of the unkept ones'
 * terms ("op|n|nccl<dt>|", n = n2 from position `from` on) */
static void nccl_capped_rank(int r, int total, int from, int n2)
{
	int pid = 1000 + r;
	uint64_t sum = 0;
	char sig[64];
	arec(pid, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":%d,\"world\":2,\"local_rank\":%d,\"pid\":%d,\"ppid\":999,"
		"\"worker\":true,\"py\":false,\"exe\":\"/bin/app\",\"img\":0,\"host\":\"h\",\"att\":0,\"t\":0.1}", r, r, pid);
	arec(pid, "c", "{\"k\":\"nccl\",\"call\":\"init\",\"id\":\"00000000000000a0\",\"nranks\":2,\"crank\":%d,\"dev\":%d,\"rc\":0,\"t\":0.2}",
		r, r);
	for (int i = 0; i < 3; i++)
		arec(pid, "c", "{\"k\":\"nccl\",\"call\":\"op\",\"op\":\"all_reduce\",\"id\":\"00000000000000a0\",\"n\":64,\"dt\":7,\"rc\":0,\"t\":%d}",
			1 + i);
	arec(pid, "c", "{\"k\":\"cap\",\"max\":5,\"t\":4}");
	for (int pos = 3; pos < total; pos++) {
		snprintf(sig, sizeof(sig), "all_reduce|%d|nccl7|", pos >= from ? n2 : 64);
		sum += dptp_audit_term(dptp_audit_sig_hash(sig, strlen(sig)), (uint64_t)pos);
	}
	arec(pid, "c", "{\"k\":\"count\",\"id\":\"00000000000000a0\",\"seq\":%d,\"nc\":%d,\"hs\":\"%016llx\",\"t\":5}", total,
		total, (unsigned long long)sum);
	arec(pid, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":0,\"records\":8,\"lost\":%d,\"dropped\":%d,\"t\":9}", total - 3,
		total - 3);
}

/* the same NCCL calls past the cap on both ranks: no gap, a pass; one rank's
 * size changed past it: P */
static void test_nccl_cap_sums(void **state)
{
	(void)state;
	nccl_capped_rank(0, 4000, 4000, 64);
	nccl_capped_rank(1, 4000, 4000, 64);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
	assert_false(arec_rep.w[0].capped);
}

static void test_nccl_cap_sums_differ(void **state)
{
	(void)state;
	nccl_capped_rank(0, 4000, 4000, 64);
	nccl_capped_rank(1, 4000, 3000, 32);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "calls past the record cap differ in op/size/dtype/root on group [0,1]: rank 1 vs rank 0"));
}

/* Rank 0 issues an async all_reduce on a second group [0,1] that rank 1
 * never issues; both then wait in recv from each other until gloo's timeout
 * raises in both. Rank 1's exception came from a failed call (done err), not
 * its own code: it is short of the collective rank 0 entered (P). */
static void test_async_skipped_then_timeout(void **state)
{
	(void)state;
	for (int r = 0; r < 2; r++) {
		int pid = 1000 + r;
		arec_rank(r, 2);
		arec(pid, "py", "{\"k\":\"group\",\"g\":[0,1],\"gn\":1,\"site\":\"a.py:6\",\"t\":0.8}");
		arec(pid, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"n\":4,\"dt\":\"float32\",\"site\":\"a.py:8\",\"t\":1}");
		arec(pid, "py", "{\"k\":\"done\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"t\":1.1}");
		if (r == 0) {
			arec(pid, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":1,\"seq\":1,\"n\":4,\"dt\":\"float32\",\"async\":true,\"site\":\"a.py:10\",\"t\":1.2}");
			arec(pid, "py", "{\"k\":\"done\",\"g\":[0,1],\"gn\":1,\"seq\":1,\"t\":1.3}");
		}
		arec(pid, "py", "{\"k\":\"op\",\"op\":\"recv\",\"g\":[0,1],\"gn\":0,\"seq\":2,\"n\":1,\"src\":%d,\"dt\":\"float32\",\"site\":\"a.py:12\",\"t\":1.4}", 1 - r);
		arec(pid, "py", "{\"k\":\"done\",\"g\":[0,1],\"gn\":0,\"seq\":2,\"err\":true,\"t\":4.4}");
		arec(pid, "py", "{\"k\":\"exc\",\"type\":\"RuntimeError\",\"msg\":\"Timed out waiting 3000ms for recv operation to complete\",\"site\":\"a.py:12\",\"t\":4.5}");
		arec(pid, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":1,\"records\":9,\"lost\":0,\"t\":4.6}");
		arec(pid, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":1,\"records\":3,\"lost\":0,\"t\":4.7}");
	}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_int_equal(arec_rep.w[0].f[0].ranks[0], 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail,
		"rank 1 never entered all_reduce(n=4, float32) at a.py:10 on group [0,1], which rank 0 entered"));
}

/* healthy: init, destroy, init again in the same world; the same counts
 * past the cap */
static void test_reinit_healthy(void **state)
{
	(void)state;
	memset(seqs, 0, sizeof(seqs));
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		op(r, "all_reduce", 0, 1, 0, 5, 1, true);
		arec(1000 + r, "py", "{\"k\":\"world\",\"id\":\"h:29500\",\"size\":2,\"rank\":%d,\"backend\":\"gloo\",\"timeout\":1800,\"t\":2}", r);
		arec(1000 + r, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":1,\"seq\":1,\"n\":1,\"site\":\"x.py:9\",\"t\":3}");
		arec_end(r);
	}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_skipped_step_hang, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_skipped_step_other_order, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_pending, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_exit_before_collective, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_os_exit, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_cap_counts, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_reinit_healthy, arec_setup, arec_teardown),
		cmocka_unit_test(test_term_vectors),
		cmocka_unit_test_setup_teardown(test_async_skipped_then_timeout, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_nccl_cap_sums, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_nccl_cap_sums_differ, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_cap_sums_equal, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_cap_sums_differ, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_cap_sum_missing, arec_setup, arec_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
