/* dptp-run --audit, mechanisms I and C (launcher/audit/analyze/names.c, i.c,
 * c.c): names, ports and segments taken by several ranks; the free-port loop
 * (EADDRINUSE, then the next port) is no finding; many names are sorted, not
 * compared pairwise. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "audit_records.h"

static void dp2tp2(void)
{
	for (int r = 0; r < 4; r++) {
		arec_rank(r, 4);
		arec_end(r);
	}
}

static void bind_port(int r, int port, int err, double t)
{
	arec(1000 + r, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"inet\",\"addr\":\"0.0.0.0\",\"port\":%d,\"rc\":%d,\"err\":%d,\"site\":\"_socket.so+0x1\",\"t\":%.2f}",
		port, err ? -1 : 0, err, t);
}

/* issue 30 item 5: every rank tries 29600, 29601, ... and keeps the first
 * that binds: each collision is followed by its own successful bind */
static void test_free_port_loop(void **state)
{
	(void)state;
	dp2tp2();
	for (int r = 0; r < 4; r++) {
		for (int p = 0; p < r; p++)
			bind_port(r, 29600 + p, EADDRINUSE, r + p * 0.1);
		bind_port(r, 29600 + r, 0, r + 0.5);
	}
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.w[0].nf, 0);
}

/* a collision the rank does not recover from: C across replicas, I within */
static void test_collisions(void **state)
{
	(void)state;
	dp2tp2();
	bind_port(0, 5557, 0, 1);
	bind_port(2, 5557, EADDRINUSE, 2); /* replica 1: C */
	bind_port(1, 6000, 0, 1);
	bind_port(0, 6000, EADDRINUSE, 2); /* replica 0 both: I */
	/* a segment each TP pair shares (O_CREAT by both, no EXCL): healthy */
	for (int r = 0; r < 4; r++)
		arec(1000 + r, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/tp-%d\",\"fl\":%d,\"rc\":3,\"err\":0,\"site\":\"a.so+0x1\",\"t\":3}", r / 2, 0100 | 02);
	/* a segment created with O_EXCL by two ranks of one replica: EEXIST,
	 * and the loser goes on to another segment elsewhere: no recovery */
	arec(1002, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/seg\",\"fl\":%d,\"rc\":3,\"err\":0,\"site\":\"b.so+0x2\",\"t\":4}", 0100 | 0200 | 02);
	arec(1003, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/seg\",\"fl\":%d,\"rc\":-1,\"err\":17,\"site\":\"b.so+0x2\",\"t\":5}", 0100 | 0200 | 02);
	arec(1003, "c", "{\"k\":\"shm\",\"call\":\"shm_open\",\"name\":\"/other\",\"fl\":%d,\"rc\":3,\"err\":0,\"site\":\"c.so+0x3\",\"t\":6}", 0100 | 02);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'C'), 1);
	assert_int_equal(arec_count(0, 'I'), 2);
	const struct audit_result *w = &arec_rep.w[0];
	for (size_t i = 0; i < w->nf; i++) {
		const struct audit_finding *f = &w->f[i];
		if (f->mech == 'C') {
			assert_int_equal(f->nreplicas, 2);
			assert_non_null(strstr(f->detail, "port 5557 taken by ranks 0,2"));
		} else if (strstr(f->detail, "6000")) {
			assert_int_equal(f->nreplicas, 1);
			assert_int_equal(f->replicas[0], 0);
		} else {
			assert_non_null(strstr(f->detail, "'/seg' taken by ranks 2,3"));
		}
	}
}

/* issue 30 item 6: 60k distinct names per rank: sorted once */
static void test_many_names(void **state)
{
	(void)state;
	char path[128];
	dp2tp2();
	for (int r = 0; r < 4; r++) {
		snprintf(path, sizeof(path), "%s/a0.p%d.c.jsonl", arec_dir, 1000 + r);
		FILE *f = fopen(path, "a");
		assert_non_null(f);
		for (int i = 0; i < 60000; i++)
			fprintf(f, "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"@r%d-n%d\",\"rc\":0,\"err\":0,\"t\":%d}\n", r, i, i);
		fclose(f);
	}
	/* and one name two ranks share */
	arec(1001, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"@r0-n59999\",\"rc\":-1,\"err\":98,\"t\":70000}");
	arec_analyze(-1);
	assert_int_equal(arec_rep.w[0].nf, 1);
	assert_int_equal(arec_rep.w[0].f[0].mech, 'I');
	assert_non_null(strstr(arec_rep.w[0].f[0].detail, "'@r0-n59999' taken by ranks 0,1"));
	assert_true(arec_rep.nrecords > 240000);
}

/* A rank that connects to a peer's socket on every request: 250,000
 * successful connects of one process to one name are one use (its first,
 * with its Python site), not 250,000 entries (about 20 MB: over a 16 MB
 * data limit in a child). Skipped under a sanitizer (its shadow counts). */
static void test_connect_loop(void **state)
{
	(void)state;
	char path[128];
	for (int r = 0; r < 2; r++) {
		arec_rank(r, 2);
		arec_end(r);
	}
	arec(1000, "c", "{\"k\":\"sock\",\"call\":\"bind\",\"fam\":\"unix\",\"addr\":\"/tmp/srv\",\"rc\":0,\"err\":0,\"t\":1}");
	snprintf(path, sizeof(path), "%s/a0.p1001.c.jsonl", arec_dir);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	for (int i = 0; i < 250000; i++)
		fprintf(f, "{\"k\":\"sock\",\"call\":\"connect\",\"fam\":\"unix\",\"addr\":\"/tmp/srv\",\"rc\":0,\"err\":0,\"t\":%d}\n", 2 + i);
	fclose(f);
	for (int i = 0; i < 3; i++)
		arec(1001, "py", "{\"k\":\"site\",\"call\":\"connect\",\"key\":\"/tmp/srv\",\"site\":\"client.py:%d\",\"outer\":\"main.py:3\",\"t\":%d}",
			7 + i, 2 + i);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_count(0, 'G'), 1);
	assert_string_equal(arec_rep.w[0].f[0].site, "client.py:7"); /* the first connect's */
	arec_analyze_limited(16, 1, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_free_port_loop, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_collisions, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_many_names, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_connect_loop, arec_setup, arec_teardown),
	};
	return arec_run(tests, sizeof(tests) / sizeof(tests[0]), 1); /* the last under a data limit */
}
