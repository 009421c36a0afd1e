/* The c10d rendezvous state codec against torch 2.11's own bytes.
 *
 * tests/data/c10d/c10d_*_states_2.11.txt are every state torch 2.11 wrote
 * in a fixed 2-node job and an elastic 1:2 job with a late node (copied from
 * reference/torchrun-captures): each must decode to what pickletools shows
 * and re-encode to the very same bytes. python_states.txt (gen_states.py,
 * Python's pickle over stand-ins of torch's classes) adds encoder cases the
 * captures lack (3 nodes, a waiting node, a deadline, big pids) and the
 * pickles the decoder must refuse without running anything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/rdzv_state.h"

struct blob {
	char name[64];
	uint8_t *b;
	size_t n;
};

/* Reads every "== NAME..." line followed by a hex line. */
static size_t load(const char *file, struct blob *out, size_t max)
{
	char path[512], *line = NULL;
	size_t cap = 0, k = 0;
	const char *root = getenv("DPTP_SOURCE_ROOT");
	snprintf(path, sizeof(path), "%s/tests/data/c10d/%s", root ? root : ".", file);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char name[64] = "";
	while (getline(&line, &cap, f) > 0) {
		if (!strncmp(line, "== ", 3)) {
			snprintf(name, sizeof(name), "%s", line + 3);
			name[strcspn(name, ":\n")] = '\0';
			continue;
		}
		size_t h = strspn(line, "0123456789abcdef");
		if (!*name || h < 4 || (line[h] != '\n' && line[h]) || k == max)
			continue;
		out[k].b = malloc(h / 2);
		assert_non_null(out[k].b);
		for (size_t i = 0; i < h / 2; i++)
			sscanf(line + 2 * i, "%2hhx", &out[k].b[i]);
		out[k].n = h / 2;
		snprintf(out[k].name, sizeof(out[k].name), "%s", name);
		k++;
		*name = '\0';
	}
	free(line);
	fclose(f);
	return k;
}

static void roundtrip(const struct blob *bl)
{
	struct rdzv_state *s = calloc(1, sizeof(*s));
	struct dptp_err err = {0};
	uint8_t *enc = NULL;
	size_t n = 0;
	assert_non_null(s);
	if (rdzv_state_decode(bl->b, bl->n, s, &err) < 0)
		fail_msg("%s: %s", bl->name, err.msg);
	assert_int_equal(rdzv_state_encode(s, &enc, &n, &err), 0);
	if (n != bl->n || memcmp(enc, bl->b, n)) {
		size_t i = 0;
		while (i < n && i < bl->n && enc[i] == bl->b[i])
			i++;
		fail_msg("%s: re-encoded bytes differ at %zu (%zu vs %zu bytes)", bl->name, i, n, bl->n);
	}
	free(enc);
	free(s);
}

static void test_torch_states_roundtrip(void **st)
{
	(void)st;
	struct blob b[32];
	size_t n = load("c10d_fixed_states_2.11.txt", b, 32), m;
	assert_int_equal(n, 5);
	m = load("c10d_elastic_latejoin_states_2.11.txt", b + n, 32 - n);
	assert_int_equal(m, 7);
	for (size_t i = 0; i < n + m; i++) {
		roundtrip(&b[i]);
		free(b[i].b);
	}
}

static void test_torch_state_fields(void **st)
{
	(void)st;
	struct blob b[32];
	struct rdzv_state *s = calloc(1, sizeof(*s));
	struct dptp_err err = {0};
	size_t n = load("c10d_fixed_states_2.11.txt", b, 32);
	assert_non_null(s);
	/* state 1: complete round 0, localhost_449_0 rank 0, localhost_466_0 rank 1 */
	assert_int_equal(rdzv_state_decode(b[1].b, b[1].n, s, &err), 0);
	assert_int_equal(s->round, 0);
	assert_true(s->complete);
	assert_false(s->closed);
	assert_false(s->has_deadline);
	assert_int_equal(s->npart, 2);
	assert_string_equal(s->part[0].addr, "localhost");
	assert_int_equal(s->part[0].pid, 449);
	assert_int_equal(s->part[1].pid, 466);
	assert_int_equal(s->rank[1], 1);
	assert_int_equal(s->nheart, 2);
	/* 2026-12-04 03:14:25.288718 UTC */
	assert_int_equal(s->heart_us[0], 1796354065288718LL);
	assert_int_equal(s->nwait + s->nredund, 0);
	/* state 3: closed */
	assert_int_equal(rdzv_state_decode(b[3].b, b[3].n, s, &err), 0);
	assert_true(s->closed);
	for (size_t i = 0; i < n; i++)
		free(b[i].b);

	/* the elastic job's round 1 with a deadline and a waiting node */
	n = load("c10d_elastic_latejoin_states_2.11.txt", b, 32);
	assert_int_equal(rdzv_state_decode(b[6].b, b[6].n, s, &err), 0);
	assert_int_equal(s->round, 1);
	assert_true(s->has_deadline);
	assert_int_equal(s->deadline_us - s->heart_us[1], 2000006);
	assert_int_equal(s->nwait, 1);
	assert_int_equal(s->wait[0].pid, 812);
	for (size_t i = 0; i < n; i++)
		free(b[i].b);
	free(s);
}

/* A state built here, step by step as torch's first agent does, gives the
 * first state torch wrote. */
static void test_build_matches_torch(void **st)
{
	(void)st;
	struct blob b[32];
	struct rdzv_state *s = calloc(1, sizeof(*s));
	struct dptp_err err = {0};
	uint8_t *enc = NULL;
	size_t encn = 0, n = load("c10d_fixed_states_2.11.txt", b, 32);
	assert_non_null(s);
	rdzv_state_init(s);
	snprintf(s->part[0].addr, sizeof(s->part[0].addr), "localhost");
	s->part[0].pid = 449;
	s->rank[0] = 0;
	s->npart = 1;
	s->heart[0] = s->part[0];
	s->heart_us[0] = 1796354065288718LL;
	s->nheart = 1;
	assert_int_equal(rdzv_state_encode(s, &enc, &encn, &err), 0);
	assert_int_equal(encn, b[0].n);
	assert_memory_equal(enc, b[0].b, encn);
	free(enc);
	for (size_t i = 0; i < n; i++)
		free(b[i].b);
	free(s);
}

static void test_python_states(void **st)
{
	(void)st;
	struct blob b[32];
	struct rdzv_state *s = calloc(1, sizeof(*s));
	size_t n = load("python_states.txt", b, 32), bad = 0;
	assert_non_null(s);
	assert_int_equal(n, 15);
	for (size_t i = 0; i < n; i++) {
		struct dptp_err err = {0};
		if (!strncmp(b[i].name, "good_", 5)) {
			roundtrip(&b[i]);
		} else if (!strncmp(b[i].name, "dup_", 4)) {
			/* what Python's pickle made of it (gen_states.py checks) */
			assert_int_equal(rdzv_state_decode(b[i].b, b[i].n, s, &err), 0);
			if (!strcmp(b[i].name, "dup_attribute_round_9")) {
				assert_int_equal(s->round, 9);
			} else {
				assert_string_equal(b[i].name, "dup_nodes_ranks_5_1");
				assert_int_equal(s->npart, 2);
				assert_int_equal(s->rank[0], 5);
				assert_int_equal(s->rank[1], 1);
				assert_int_equal(s->nwait, 1);
				assert_int_equal(s->nheart, 1);
				assert_true(rdzv_state_nd_eq(&s->heart[0], &s->part[0]));
			}
		} else {
			int rc = rdzv_state_decode(b[i].b, b[i].n, s, &err);
			if (rc != -EPROTO)
				fail_msg("%s: decoded (rc %d)", b[i].name, rc);
			assert_non_null(strstr(err.msg, "not torch's"));
			bad++;
		}
	}
	assert_int_equal(bad, 10);
	/* what the refusals say */
	for (size_t i = 0; i < n; i++) {
		struct dptp_err err = {0};
		rdzv_state_decode(b[i].b, b[i].n, s, &err);
		if (!strcmp(b[i].name, "bad_global"))
			assert_non_null(strstr(err.msg, "refusing the global posix.system"));
		if (!strcmp(b[i].name, "bad_naive_datetime"))
			assert_non_null(strstr(err.msg, "naive datetime"));
		if (!strcmp(b[i].name, "bad_unknown_attribute"))
			assert_non_null(strstr(err.msg, "unknown attribute 'extra'"));
		if (!strcmp(b[i].name, "bad_huge_utc_offset"))
			assert_non_null(strstr(err.msg, "timedelta past 999999999 days"));
		if (!strncmp(b[i].name, "bad_addr_", 9))
			assert_non_null(strstr(err.msg, "not UTF-8"));
		free(b[i].b);
	}
	free(s);
}

static void test_truncated_and_garbage(void **st)
{
	(void)st;
	struct blob b[32];
	struct rdzv_state *s = calloc(1, sizeof(*s));
	size_t n = load("c10d_fixed_states_2.11.txt", b, 32);
	assert_non_null(s);
	for (size_t cut = 0; cut < b[1].n; cut++) {
		struct dptp_err err = {0};
		assert_int_equal(rdzv_state_decode(b[1].b, cut, s, &err), -EPROTO);
	}
	/* every single-byte change either decodes to a state or is refused */
	for (size_t i = 0; i < b[1].n; i++) {
		struct dptp_err err = {0};
		uint8_t save = b[1].b[i];
		b[1].b[i] ^= 0x5a;
		int rc = rdzv_state_decode(b[1].b, b[1].n, s, &err);
		assert_true(rc == 0 || rc == -EPROTO);
		b[1].b[i] = save;
	}
	for (size_t i = 0; i < n; i++)
		free(b[i].b);
	free(s);
}

/* PROTO 4, None, k MEMOIZE, STOP: what the decoder says of it. */
static int memoize_n(size_t k, struct rdzv_state *s, struct dptp_err *err)
{
	size_t n = 3 + k + 1;
	uint8_t *p = malloc(n);
	assert_non_null(p);
	p[0] = 0x80, p[1] = 4, p[2] = 'N';
	memset(p + 3, 0x94, k);
	p[n - 1] = '.';
	int rc = rdzv_state_decode(p, n, s, err);
	free(p);
	return rc;
}

/* 2^20 + 1 MEMOIZE opcodes (anyone who reaches the store can write them):
 * refused as "memo too large", nothing freed twice (it was: under ASan a
 * double free, without it SIGSEGV, and at 2^21 SIGABRT). */
static void test_memo_bomb(void **st)
{
	(void)st;
	struct rdzv_state *s = calloc(1, sizeof(*s));
	struct dptp_err err = {0};
	assert_non_null(s);
	assert_int_equal(memoize_n((1u << 20) + 1, s, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "memo too large"));
	assert_int_equal(memoize_n(1u << 21, s, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "memo too large"));
	/* a memo just under the cap is fine as far as the memo goes */
	assert_int_equal(memoize_n(1u << 20, s, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "not a _RendezvousState"));
	free(s);
}

static void test_base64(void **st)
{
	(void)st;
	uint8_t *o = NULL;
	size_t n = 0;
	char *e = rdzv_state_b64_encode((const uint8_t *)"canimadam", 9);
	assert_string_equal(e, RDZV_NULL_SENTINEL);
	free(e);
	e = rdzv_state_b64_encode((const uint8_t *)"ab", 2);
	assert_string_equal(e, "YWI=");
	assert_int_equal(rdzv_state_b64_decode(e, 4, &o, &n), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(o, "ab", 2);
	free(o);
	free(e);
	assert_int_equal(rdzv_state_b64_decode("YW=I", 4, &o, &n), -EPROTO);
	assert_int_equal(rdzv_state_b64_decode("YWI", 3, &o, &n), -EPROTO);
	assert_int_equal(rdzv_state_b64_decode("Y*I=", 4, &o, &n), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_torch_states_roundtrip),
		cmocka_unit_test(test_torch_state_fields),
		cmocka_unit_test(test_build_matches_torch),
		cmocka_unit_test(test_python_states),
		cmocka_unit_test(test_truncated_and_garbage),
		cmocka_unit_test(test_memo_bomb),
		cmocka_unit_test(test_base64),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
