/* dptp-run --audit, the analysis's record model (launcher/audit/analyze/
 * load.c, analyze.c): processes by pid, worlds from world records, helpers
 * by their parent, the launcher's view, gaps (no false pass), sites. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "audit_records.h"

/* a healthy two-rank job recorded in full: one world, no gap, no finding */
static void test_complete(void **state)
{
	(void)state;
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		arec(1000 + r, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"n\":4,\"site\":\"m.py:5\",\"t\":1}");
		arec(1000 + r, "py", "{\"k\":\"done\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"t\":1.1}");
		arec_end(r);
		arec_launcher("{\"k\":\"wstart\",\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"att\":0,\"t\":0}", r, r, 1000 + r);
		arec_launcher("{\"k\":\"wexit\",\"rank\":%d,\"pid\":%d,\"att\":0,\"code\":0,\"sig\":null,\"core\":false,\"t\":100}", r,
			1000 + r);
	}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_string_equal(arec_rep.w[0].world_id, "h:29500");
	assert_int_equal(arec_rep.w[0].world, 2);
	assert_int_equal(arec_rep.w[0].nrecorded, 2);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
	assert_int_equal(arec_rep.ngaps, 0);
	assert_int_equal(arec_rep.nexits, 2);
	assert_int_equal(arec_rep.attempts, 1);
}

/* Workers started by the program itself (mp.spawn under one launcher
 * worker): each child is its own rank of the world it joins; the parent,
 * which only waits, makes no world of its own. A child's socket is its own
 * rank's, not the parent's RANK. */
static void test_spawned_world(void **state)
{
	(void)state;
	arec_launcher("{\"k\":\"wstart\",\"rank\":0,\"local_rank\":0,\"pid\":900,\"att\":0,\"t\":0}");
	arec(900, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":0,\"world\":1,\"local_rank\":0,\"pid\":900,\"ppid\":1,\"worker\":true,\"py\":true,\"img\":0,\"host\":\"h\",\"att\":0}");
	arec(900, "py", "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":0,\"world\":1,\"local_rank\":0,\"pid\":900,\"ppid\":1,\"worker\":true,\"host\":\"h\",\"att\":0}");
	for (int r = 0; r < 4; r++) {
		int pid = 1000 + r;
		arec(pid, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":0,\"world\":1,\"local_rank\":0,\"pid\":%d,\"ppid\":900,\"worker\":false,\"py\":true,\"img\":0,\"host\":\"h\",\"att\":0,\"t\":0.1}", pid);
		arec(pid, "py", "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":0,\"world\":1,\"local_rank\":0,\"pid\":%d,\"ppid\":900,\"worker\":false,\"host\":\"h\",\"att\":0,\"t\":0.2}", pid);
		arec(pid, "py", "{\"k\":\"world\",\"id\":\"127.0.0.1:29600\",\"size\":4,\"rank\":%d,\"backend\":\"gloo\",\"timeout\":1800,\"t\":0.5}", r);
		arec(pid, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:1\",\"t\":0.6}", r / 2 * 2, r / 2 * 2 + 1);
		arec(pid, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:2\",\"t\":0.7}", r % 2, r % 2 + 2);
		/* the segment of replica 0 opened by replica 1 */
		if (r == 0)
			arec(pid, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/ws\",\"fl\":%d,\"rc\":3,\"err\":0,\"site\":\"libc.so+0x10\",\"t\":1}", 0100 | 02);
		if (r == 2)
			arec(pid, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/ws\",\"fl\":2,\"rc\":3,\"err\":0,\"site\":\"libc.so+0x10\",\"t\":2}");
		arec(pid, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":0,\"t\":99}");
	}
	arec(900, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":2,\"lost\":0,\"t\":100}");
	arec_launcher("{\"k\":\"wexit\",\"rank\":0,\"pid\":900,\"att\":0,\"code\":0,\"sig\":null,\"core\":false,\"t\":101}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	const struct audit_result *w = &arec_rep.w[0];
	assert_string_equal(w->world_id, "127.0.0.1:29600");
	assert_int_equal(w->world, 4);
	assert_true(w->layout_known);
	assert_int_equal(w->layout.dp, 2);
	assert_int_equal(w->ngaps, 0);
	assert_int_equal(w->nf, 1);
	assert_int_equal(w->f[0].mech, 'G');
	assert_int_equal(w->f[0].ranks[0], 2);
	assert_string_equal(w->f[0].world_id, "127.0.0.1:29600");
	/* the C recorder's own site when Python made none */
	assert_string_equal(w->f[0].site, "libc.so+0x10");
}

/* A helper process (no world of its own) is its parent's rank */
static void test_helper_joins_parent(void **state)
{
	(void)state;
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		arec_end(r);
	}
	/* rank 1's subprocess and rank 0 both bind port 5557: a collision of ranks 0 and 1 */
	arec(1000, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"inet\",\"addr\":\"0.0.0.0\",\"port\":5557,\"rc\":0,\"err\":0,\"t\":1}");
	arec(3001, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":1,\"world\":2,\"local_rank\":1,\"pid\":3001,\"ppid\":1001,\"worker\":false,\"py\":false,\"img\":0,\"host\":\"h\",\"att\":0}");
	arec(3001, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"inet\",\"addr\":\"0.0.0.0\",\"port\":5557,\"rc\":-1,\"err\":98,\"t\":2}");
	arec(3001, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":1,\"records\":2,\"lost\":0,\"t\":3}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_int_equal(arec_rep.w[0].nf, 1);
	assert_int_equal(arec_rep.w[0].f[0].nranks, 2);
	assert_int_equal(arec_rep.w[0].f[0].ranks[1], 1);
}

/* two worlds of one job (a vLLM engine per DP rank): analysed apart, each
 * finding names its world */
static void test_two_worlds(void **state)
{
	(void)state;
	for (int r = 0; r < 4; r++) {
		int pid = 1000 + r;
		arec(pid, "py", "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":%d,\"world\":4,\"local_rank\":%d,\"pid\":%d,\"ppid\":1,\"worker\":true,\"host\":\"h\",\"att\":0}", r, r, pid);
		arec(pid, "py", "{\"k\":\"world\",\"id\":\"h:%d\",\"size\":2,\"rank\":%d,\"t\":0.5}", 29500 + r / 2, r % 2);
		/* world h:29501 disagrees on the size of its all-reduce */
		arec(pid, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"n\":%d,\"site\":\"e.py:9\",\"t\":1}",
			r == 3 ? 3 : 4);
		arec(pid, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":4,\"lost\":0,\"t\":9}");
	}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 2);
	assert_string_equal(arec_rep.w[0].world_id, "h:29500");
	assert_string_equal(arec_rep.w[1].world_id, "h:29501");
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_count(1, 'P'), 1);
	assert_string_equal(arec_rep.w[1].f[0].world_id, "h:29501");
}

/* no false pass: every way a process was not fully recorded is a gap */
static void test_gaps(void **state)
{
	(void)state;
	char path[128];
	/* rank 0: the C recorder saw Python, the Python recorder never wrote */
	arec(1000, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":0,\"world\":4,\"local_rank\":0,\"pid\":1000,\"ppid\":1,\"worker\":true,\"py\":true,\"exe\":\"/usr/bin/python3.11\",\"img\":0,\"host\":\"h\",\"att\":0}");
	arec(1000, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":0,\"records\":2,\"lost\":0,\"t\":9}");
	/* rank 1: a torn last line (a full disk) */
	arec_rank(1, 4);
	snprintf(path, sizeof(path), "%s/a0.p1001.py.jsonl", arec_dir);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	fputs("{\"k\":\"op\",\"op\":\"all_re", f);
	fclose(f);
	/* rank 2: records lost, and a torn line the next record ended */
	arec_rank(2, 4);
	arec(1002, "py", "{\"k\":\"op\",\"op\":\"all_re");
	arec(1002, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":7,\"t\":99}");
	arec_rank(3, 4);
	arec(1003, "py", "{\"k\":\"cap\",\"max\":200000,\"t\":5}");
	arec(1003, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":0,\"t\":99}");
	/* rank 3 execs another Python in which the Python recorder does not load */
	arec(1003, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":3,\"world\":4,\"local_rank\":3,\"pid\":1003,\"ppid\":999,\"worker\":true,\"py\":true,\"exe\":\"/opt/py/bin/python3\",\"img\":1,\"host\":\"h\",\"att\":0}");
	/* a worker of which nothing recorded (a static binary) */
	arec_launcher("{\"k\":\"wstart\",\"rank\":4,\"local_rank\":4,\"pid\":1004,\"att\":0,\"t\":0}");
	arec_launcher("{\"k\":\"wexit\",\"rank\":4,\"pid\":1004,\"att\":0,\"code\":0,\"sig\":null,\"core\":false,\"t\":9}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_true(arec_gap(0, "rank 0 of world h:29500 has no records"));
	assert_true(arec_gap(SIZE_MAX, "Python recorder did not load in pid 1000"));
	assert_true(arec_gap(0, "records of pid 1001 truncated"));
	assert_true(arec_gap(0, "pid 1001 (rank 1) has no end record"));
	assert_true(arec_gap(0, "pid 1002 lost 7 records"));
	assert_true(arec_gap(0, "pid 1002 wrote 1 unreadable record "));
	assert_true(arec_gap(0, "record cap (200000)"));
	assert_true(arec_gap(0, "did not load in pid 1003 after an exec of /opt/py/bin/python3"));
	assert_true(arec_rep.w[0].capped);
	assert_true(arec_gap(SIZE_MAX, "no recorder loaded in rank 4 (pid 1004)"));
}

/* The k-th C record of a call + key gets the k-th Python site of that
 * process; NCCL's own GPU buffers are no finding */
static void test_sites(void **state)
{
	(void)state;
	for (int r = 0; r < 4; r++) {
		arec_rank(r, 4);
		arec_end(r);
	}
	for (int k = 0; k < 2; k++) {
		arec(1000, "py", "{\"k\":\"site\",\"call\":\"bind\",\"key\":\"@ws\",\"site\":\"fd_exchange.py:%d\",\"outer\":\"train.py:57\"}", 141 + k);
		arec(1000, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"@ws\",\"rc\":%d,\"err\":%d,\"site\":\"_socket.so+0xbfd6\",\"t\":%d}",
			k ? -1 : 0, k ? 98 : 0, 1 + k);
	}
	arec(1002, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"@ws\",\"rc\":-1,\"err\":98,\"site\":\"_socket.so+0xbfd6\",\"t\":3}");
	arec(1003, "c", "{\"k\":\"gpu\",\"call\":\"ipc_open\",\"api\":\"runtime\",\"ht\":\"ipc\",\"h\":\"00000000000000aa\",\"dev\":0,\"rc\":0,\"site\":\"libnccl.so+0x1\",\"by\":\"nccl\"}");
	arec(1000, "c", "{\"k\":\"gpu\",\"call\":\"ipc_get\",\"api\":\"runtime\",\"ht\":\"ipc\",\"h\":\"00000000000000aa\",\"dev\":0,\"rc\":0,\"site\":\"libnccl.so+0x1\",\"by\":\"nccl\"}");
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.w[0].nf, 1);
	assert_int_equal(arec_rep.w[0].f[0].mech, 'I');
	assert_string_equal(arec_rep.w[0].f[0].site, "fd_exchange.py:141");
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "(called from train.py:57)"));
}

/* a record longer than the read buffer, and many records: read a buffer at
 * a time, every line once */
static void test_long_lines(void **state)
{
	(void)state;
	char *site = malloc(200001);
	assert_non_null(site);
	memset(site, 'x', 200000);
	site[200000] = '\0';
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		for (int i = 0; i < 3000; i++)
			arec(1000 + r, "py", "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"n\":4,\"site\":\"%s:5\",\"t\":%d}",
				i + 1, i == 1500 ? site : "m.py", i);
		arec_end(r);
	}
	free(site);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.nw, 1);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
	assert_true(arec_rep.nrecords >= 2 * 3000);
}

/* issue 30 item 7: a restart's clean attempt does not hide an earlier one's finding */
static void test_attempts(void **state)
{
	(void)state;
	char path[128];
	for (int att = 0; att < 2; att++)
		for (int r = 0; r < 2; r++) {
			snprintf(path, sizeof(path), "%s/a%d.p%d.py.jsonl", arec_dir, att, 1000 + 10 * att + r);
			FILE *f = fopen(path, "w");
			assert_non_null(f);
			fprintf(f, "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":%d,\"world\":2,\"local_rank\":%d,\"pid\":%d,\"ppid\":1,\"worker\":true,\"host\":\"h\",\"att\":%d}\n",
				r, r, 1000 + 10 * att + r, att);
			fprintf(f, "{\"k\":\"world\",\"id\":\"h:29500\",\"size\":2,\"rank\":%d,\"t\":1}\n", r);
			fprintf(f, "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":1,\"n\":%d,\"site\":\"t.py:3\",\"t\":2}\n",
				att == 0 && r == 1 ? 5 : 4);
			fprintf(f, "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":3,\"lost\":0,\"t\":3}\n");
			fclose(f);
		}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.attempts, 2);
	assert_int_equal(arec_rep.nw, 2);
	assert_int_equal(arec_rep.w[0].attempt, 0);
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_int_equal(arec_rep.w[0].f[0].attempt, 0);
	assert_int_equal(arec_rep.w[1].attempt, 1);
	assert_int_equal(arec_rep.w[1].nf, 0);
}

/* issue 30 item 6: the analysis holds the calls its ranks are apart by, not
 * all of them. Two ranks make `calls` all_reduce calls on [0,1], rank 1
 * `lag` calls behind rank 0 in time; from call `bad` on (-1 never) rank 1
 * passes another size. */
static FILE *calls_file(int r)
{
	char path[128];
	arec_rank(r, 2);
	snprintf(path, sizeof(path), "%s/a0.p%d.py.jsonl", arec_dir, 1000 + r);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	return f;
}

static void calls_job(int calls, int lag, int bad)
{
	for (int r = 0; r < 2; r++) {
		FILE *f = calls_file(r);
		for (int i = 0; i < calls; i++) {
			double t = 1 + (i + (r ? lag : 0)) * 1e-3;
			fprintf(f, "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"n\":%d,\"dt\":\"float32\",\"site\":\"loop.py:%d\",\"t\":%.4f}\n"
				"{\"k\":\"done\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"t\":%.4f}\n", i + 1, r && bad >= 0 && i >= bad ? 2 : 1,
				7 + i % 3, t, i + 1, t + 1e-4);
		}
		fclose(f);
		arec(1000 + r, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":0,\"t\":%d}", calls);
		arec(1000 + r, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":0,\"records\":3,\"lost\":0,\"t\":%d}", calls + 1);
	}
	arec_analyze(-1);
	arec_print();
	print_message("# %zu calls, at most %zu held at once\n", arec_rep.calls, arec_rep.calls_held);
	assert_int_equal(arec_rep.calls, 2 * (size_t)calls);
}

static void test_calls_held(void **state)
{
	(void)state;
	calls_job(30000, 0, -1);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_int_equal(arec_rep.w[0].ngaps, 0);
	assert_true(arec_rep.calls_held <= 8);
}

/* rank 1 500 calls behind: about 500 held, whatever the number of calls */
static void test_calls_held_skew(void **state)
{
	(void)state;
	calls_job(30000, 500, -1);
	assert_int_equal(arec_rep.w[0].nf, 0);
	assert_true(arec_rep.calls_held >= 500 && arec_rep.calls_held <= 1000);
}

/* a disagreement deep in the loop is found as before, and the group keeps
 * only the position where it happened */
static void test_calls_diverge_late(void **state)
{
	(void)state;
	calls_job(30000, 3, 20000);
	assert_int_equal(arec_count(0, 'P'), 1);
	assert_non_null(strstr(arec_rep.w[0].f[0].detail,
		"collective #20001 on group [0,1]: rank 1 called all_reduce(n=2, float32) at loop.py:9 while rank 0 called all_reduce(n=1, float32) at loop.py:9"));
	assert_true(arec_rep.calls_held <= 16);
}

/* The same under a hard limit of 16 MB of data in a child: 160,000 calls
 * kept whole need about 20 MB (128 bytes each before the streaming
 * analysis); streamed, the analysis needs its windows only. Skipped under a
 * sanitizer (its shadow memory counts). */
static void test_calls_rlimit(void **state)
{
	(void)state;
	for (int r = 0; r < 2; r++) {
		FILE *f = calls_file(r);
		for (int i = 0; i < 80000; i++)
			fprintf(f, "{\"k\":\"op\",\"op\":\"all_reduce\",\"g\":[0,1],\"gn\":0,\"seq\":%d,\"n\":1,\"site\":\"l.py:7\",\"t\":%d.%d}\n",
				i + 1, 1 + i / 1000, i % 1000 * 2 + r);
		fclose(f);
		arec_end(r);
	}
	arec_analyze_limited(16, 0, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_complete, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_spawned_world, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_helper_joins_parent, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_two_worlds, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_gaps, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_sites, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_long_lines, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_attempts, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_calls_held, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_calls_held_skew, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_calls_diverge_late, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_calls_rlimit, arec_setup, arec_teardown),
	};
	return arec_run(tests, sizeof(tests) / sizeof(tests[0]), 1); /* the last under a data limit */
}
