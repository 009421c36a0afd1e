/* dptp-check's option parsing: defaults, every option in both spellings,
 * and each usage error with its one-line message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "options.h"

#define MAXARGS 64

/* Parses the words of argv (NULL-terminated) after "dptp-check". */
static int parse_v(struct dptp_options *o, struct dptp_err *err, const char *const *words)
{
	char *argv[MAXARGS + 2];
	int argc = 0;
	argv[argc++] = (char *)"dptp-check";
	for (; *words; words++) {
		assert_true(argc < MAXARGS);
		argv[argc++] = (char *)*words;
	}
	argv[argc] = NULL;
	dptp_options_init(o);
	memset(err, 0, sizeof(*err));
	return dptp_options_parse(o, argc, argv, err);
}

#define PARSE(o, err, ...) parse_v((o), (err), (const char *const[]){ __VA_ARGS__, NULL })

static void ok(struct dptp_options *o, const char *const *words)
{
	struct dptp_err err;
	int rc = parse_v(o, &err, words);
	if (rc != 0)
		fail_msg("'%s ...' refused: %s", words[0], err.msg);
}

#define OK(o, ...) ok((o), (const char *const[]){ __VA_ARGS__, NULL })

/* Expects a refusal with exactly this message. */
static void bad(const char *want, const char *const *words)
{
	struct dptp_options o;
	struct dptp_err err;
	int rc = parse_v(&o, &err, words);
	if (rc != -EINVAL)
		fail_msg("'%s ...' gave %d, expected -EINVAL (%s)", words[0], rc, want);
	assert_string_equal(err.msg, want);
	assert_null(strchr(err.msg, '\n'));
}

#define BAD(want, ...) bad((want), (const char *const[]){ __VA_ARGS__, NULL })

static void test_defaults(void **state)
{
	struct dptp_options o;
	struct dptp_err err;
	char *argv[] = { (char *)"dptp-check", NULL };
	dptp_options_init(&o);
	assert_int_equal(dptp_options_parse(&o, 1, argv, &err), 0);
	assert_int_equal(o.dp, 0);
	assert_int_equal(o.tp, 0);
	assert_int_equal(o.pp, 0);
	assert_int_equal(o.checks, (1u << dptp_nchecks) - 1);
	assert_int_equal(o.inject, 0);
	assert_int_equal(o.backend, DPTP_BACKEND_AUTO);
	assert_int_equal(o.dtype, DPTP_DTYPE_BF16);
	assert_int_equal(o.tokens, 128);
	assert_int_equal(o.hidden, 4096);
	assert_true(o.seed == 1);
	assert_true(o.timeout == 60);
	assert_true(o.eps == 1e-6);
	assert_int_equal(o.format, DPTP_FORMAT_TEXT);
	assert_null(o.output);
	assert_false(o.bench);
	assert_false(o.list);
	assert_int_equal(o.verbose, 0);
	assert_false(o.version);
	assert_false(o.help);
}

static void test_every_option_separate(void **state)
{
	struct dptp_options o;
	OK(&o, "--dp", "2", "--tp", "4", "--pp", "3", "--checks", "opid,dispatch",
	   "--inject", "bcast-global-src,opid-seeded", "--backend", "host", "--dtype", "fp16",
	   "--tokens", "256", "--hidden", "1024", "--seed", "18446744073709551615",
	   "--timeout", "2.5", "--eps", "1e-5", "--format", "json", "--output", "r.json",
	   "--bench", "--list", "-v", "--verbose", "--version", "-h");
	assert_int_equal(o.dp, 2);
	assert_int_equal(o.tp, 4);
	assert_int_equal(o.pp, 3);
	assert_int_equal(o.checks, (1u << dptp_check_lookup("opid")) | (1u << dptp_check_lookup("dispatch")));
	assert_int_equal(o.inject, (1u << DPTP_FAULT_BCAST_GLOBAL_SRC) | (1u << DPTP_FAULT_OPID_SEEDED));
	assert_int_equal(o.backend, DPTP_BACKEND_HOST);
	assert_int_equal(o.dtype, DPTP_DTYPE_FP16);
	assert_int_equal(o.tokens, 256);
	assert_int_equal(o.hidden, 1024);
	assert_true(o.seed == UINT64_MAX);
	assert_true(o.timeout == 2.5);
	assert_true(o.eps == 1e-5);
	assert_int_equal(o.format, DPTP_FORMAT_JSON);
	assert_string_equal(o.output, "r.json");
	assert_true(o.bench);
	assert_true(o.list);
	assert_int_equal(o.verbose, 2);
	assert_true(o.version);
	assert_true(o.help);
}

static void test_every_option_equals(void **state)
{
	struct dptp_options o;
	OK(&o, "--dp=8", "--tp=1", "--pp=2", "--checks=all", "--inject=all", "--backend=cuda",
	   "--dtype=fp32", "--tokens=1", "--hidden=8", "--seed=0", "--timeout=86400",
	   "--eps=1", "--format=junit", "--output=out/x.xml", "--help");
	assert_int_equal(o.dp, 8);
	assert_int_equal(o.tp, 1);
	assert_int_equal(o.pp, 2);
	assert_int_equal(o.checks, (1u << dptp_nchecks) - 1);
	assert_int_equal(o.inject, (1u << DPTP_NFAULTS) - 1);
	assert_int_equal(o.backend, DPTP_BACKEND_CUDA);
	assert_int_equal(o.dtype, DPTP_DTYPE_FP32);
	assert_int_equal(o.tokens, 1);
	assert_int_equal(o.hidden, 8);
	assert_true(o.seed == 0);
	assert_true(o.timeout == 86400);
	assert_true(o.eps == 1);
	assert_int_equal(o.format, DPTP_FORMAT_JUNIT);
	assert_string_equal(o.output, "out/x.xml");
	assert_true(o.help);
	assert_false(o.bench);
}

static void test_values(void **state)
{
	struct dptp_options o;
	OK(&o, "--tp", "4096", "--dp", "1", "--tokens", "65536", "--hidden", "65536");
	assert_int_equal(o.tp, 4096);
	assert_int_equal(o.tokens, 65536);
	assert_int_equal(o.hidden, 65536);
	OK(&o, "--tokens", "4K", "--hidden", "8k");
	assert_int_equal(o.tokens, 4096);
	assert_int_equal(o.hidden, 8192);
	OK(&o, "--seed", "010", "--tp", "08", "--tokens", "0016");
	assert_true(o.seed == 10); /* decimal, as torch reads numbers */
	assert_int_equal(o.tp, 8);
	assert_int_equal(o.tokens, 16);
	OK(&o, "--inject", "none");
	assert_int_equal(o.inject, 0);
	OK(&o, "--inject", "all", "--inject", "none");   /* last one wins */
	assert_int_equal(o.inject, 0);
	OK(&o, "--checks", "device-map");
	assert_int_equal(o.checks, 1u << dptp_check_lookup("device-map"));
	OK(&o, "--backend", "auto", "--format", "text", "--dtype", "bf16");
	assert_int_equal(o.backend, DPTP_BACKEND_AUTO);
	assert_int_equal(o.format, DPTP_FORMAT_TEXT);
	OK(&o, "-vvv");
	assert_int_equal(o.verbose, 3);
	OK(&o, "-vh");
	assert_int_equal(o.verbose, 1);
	assert_true(o.help);
	OK(&o, "--tim", "3");   /* unique abbreviation */
	assert_true(o.timeout == 3);
	OK(&o, "--timeout", "1e-3", "--eps", "0.5");
	assert_true(o.timeout == 1e-3);
	OK(&o, "--");
}

static void test_bad_numbers(void **state)
{
	BAD("invalid value 'abc' for --tp: not a number", "--tp", "abc");
	BAD("invalid value 'abc' for --tp: not a number", "--tp=abc");
	BAD("invalid value '2x' for --dp: not a number", "--dp", "2x");
	BAD("invalid value '2 ' for --pp: not a number", "--pp", "2 ");
	BAD("invalid value ' 2' for --pp: not a number", "--pp", " 2");
	BAD("invalid value '-1' for --tp: not a number", "--tp=-1");
	BAD("invalid value '+1' for --tp: not a number", "--tp=+1");
	BAD("invalid value '' for --tp: not a number", "--tp=");
	BAD("invalid value '2K' for --tp: not a number", "--tp", "2K");
	BAD("invalid value '1.5' for --tokens: not a number", "--tokens", "1.5");
	BAD("invalid value '0x8' for --tp: not a number", "--tp", "0x8");
	BAD("invalid value '0x10' for --seed: not a number", "--seed", "0x10");
	BAD("invalid value '0X10' for --tokens: not a number", "--tokens", "0X10");
	BAD("invalid value '0x1p3' for --timeout: not a number", "--timeout", "0x1p3");
	BAD("invalid value '0' for --tp: out of range 1..4096", "--tp", "0");
	BAD("invalid value '4097' for --dp: out of range 1..4096", "--dp", "4097");
	BAD("invalid value '0' for --pp: out of range 1..4096", "--pp", "0");
	BAD("invalid value '99999999999999999999999' for --tp: out of range 1..4096",
	    "--tp", "99999999999999999999999");
	BAD("invalid value '0' for --tokens: out of range 1..65536", "--tokens", "0");
	BAD("invalid value '65537' for --tokens: out of range 1..65536", "--tokens", "65537");
	BAD("invalid value '4' for --hidden: out of range 8..65536", "--hidden", "4");
	BAD("invalid value '65544' for --hidden: out of range 8..65536", "--hidden", "65544");
	BAD("invalid value '100' for --hidden: not a multiple of 8", "--hidden", "100");
	BAD("invalid value '4100' for --hidden: not a multiple of 8", "--hidden=4100");
	BAD("invalid value '18446744073709551616' for --seed: out of range 0..18446744073709551615",
	    "--seed", "18446744073709551616");
	BAD("invalid value 'x1' for --seed: not a number", "--seed", "x1");
	BAD("invalid value '0' for --timeout: must be > 0 and <= 86400", "--timeout", "0");
	BAD("invalid value '-1' for --timeout: must be > 0 and <= 86400", "--timeout", "-1");
	BAD("invalid value '86401' for --timeout: must be > 0 and <= 86400", "--timeout", "86401");
	BAD("invalid value 'nan' for --timeout: must be > 0 and <= 86400", "--timeout", "nan");
	BAD("invalid value 'inf' for --timeout: must be > 0 and <= 86400", "--timeout", "inf");
	BAD("invalid value '10s' for --timeout: not a number", "--timeout", "10s");
	BAD("invalid value '' for --timeout: not a number", "--timeout=");
	BAD("invalid value '0' for --eps: must be > 0 and <= 1", "--eps", "0");
	BAD("invalid value '1.5' for --eps: must be > 0 and <= 1", "--eps", "1.5");
	BAD("invalid value '1e-6x' for --eps: not a number", "--eps", "1e-6x");
}

/* The parse helpers read numbers as torch does (issue 24 item 6): decimal
 * digits only, leading zeros included; hex and octal forms refused. */
static void test_parse_decimal(void **state)
{
	static const struct {
		const char *s;
		bool suffix;
		int rc;
		uint64_t v;
	} u[] = {
		{"010", false, 0, 10}, {"0", false, 0, 0}, {"00", false, 0, 0}, {"08", false, 0, 8},
		{"09", false, 0, 9}, {"029500", false, 0, 29500}, {"18446744073709551615", false, 0, UINT64_MAX},
		{"0x8", false, -EINVAL, 0}, {"0X8", false, -EINVAL, 0}, {"0x", false, -EINVAL, 0},
		{"x8", false, -EINVAL, 0}, {"0b1", false, -EINVAL, 0}, {"8x", false, -EINVAL, 0},
		{"+8", false, -EINVAL, 0}, {"-8", false, -EINVAL, 0}, {" 8", false, -EINVAL, 0},
		{"8 ", false, -EINVAL, 0}, {"", false, -EINVAL, 0}, {"1_0", false, -EINVAL, 0},
		{"18446744073709551616", false, -ERANGE, 0},
		{"016M", true, 0, 16u << 20}, {"4k", true, 0, 4096}, {"1G", true, 0, 1u << 30},
		{"0x10M", true, -EINVAL, 0}, {"0x1", true, -EINVAL, 0}, {"16MB", true, -EINVAL, 0},
		{"16M", false, -EINVAL, 0}, {"17179869184G", true, -ERANGE, 0},
	};
	for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++) {
		uint64_t v = 12345;
		int rc = dptp_parse_u64(u[i].s, 0, UINT64_MAX, u[i].suffix, &v);
		if (rc != u[i].rc || (rc == 0 && v != u[i].v))
			fail_msg("dptp_parse_u64('%s'): %d %" PRIu64 ", want %d %" PRIu64, u[i].s, rc, v, u[i].rc, u[i].v);
	}
	uint64_t v;
	assert_int_equal(dptp_parse_u64("010", 0, 9, false, &v), -ERANGE); /* ten, not eight */
	double d = 0;
	assert_int_equal(dptp_parse_double("010", 0, 100, &d), 0);
	assert_true(d == 10);
	assert_int_equal(dptp_parse_double("2.5e1", 0, 100, &d), 0);
	assert_true(d == 25);
	assert_int_equal(dptp_parse_double("0x10", 0, 100, &d), -EINVAL);
	assert_int_equal(dptp_parse_double("0x1p3", 0, 100, &d), -EINVAL);
	assert_int_equal(dptp_parse_double("0X1", 0, 100, &d), -EINVAL);
}

static void test_layouts(void **state)
{
	BAD("--layouts cannot be combined with --dp, --tp or --pp (it chooses the layouts itself)",
	    "--layouts", "all", "--tp", "2");
	BAD("--layouts cannot be combined with --bench", "--layouts", "2x1x2", "--bench");
	BAD("invalid value '2x1' for --layouts: '2x1' is not DPxPPxTP (three sizes 1..4096, e.g. 2x1x2)",
	    "--layouts", "2x1");
	BAD("invalid value '2x01x1' for --layouts: '2x01x1' is not DPxPPxTP (three sizes 1..4096, e.g. 2x1x2)",
	    "--layouts", "2x01x1");
	BAD("invalid value '2x1x2,2x1x2' for --layouts: '2x1x2' given twice", "--layouts", "2x1x2,2x1x2");
	BAD("invalid value '2x1x2,' for --layouts: empty or over-long layout", "--layouts", "2x1x2,");
	int lay[DPTP_MAX_LAYOUTS][3], n = 0;
	struct dptp_err err = {0};
	assert_int_equal(dptp_layouts_parse("all", 4, lay, DPTP_MAX_LAYOUTS, &n, &err), 0);
	assert_int_equal(n, 6);
	assert_int_equal(lay[0][0], 4);
	assert_int_equal(lay[5][2], 4);
	assert_int_equal(dptp_layouts_parse("all", 8, lay, DPTP_MAX_LAYOUTS, &n, &err), 0);
	assert_int_equal(n, 10);
	assert_int_equal(dptp_layouts_parse("2x2x2", 4, lay, DPTP_MAX_LAYOUTS, &n, &err), -EINVAL);
	assert_string_equal(err.msg, "--layouts 2x2x2: dp 2 x pp 2 x tp 2 = 8, but the world size is 4");
	/* 2642*2501*650 = 2^32 + 4: in int it wrapped to 4 and matched */
	assert_int_equal(dptp_layouts_parse("2642x2501x650", 4, lay, DPTP_MAX_LAYOUTS, &n, &err), -EINVAL);
	assert_string_equal(err.msg, "invalid value '2642x2501x650' for --layouts: '2642x2501x650' has 4294967300 "
			    "ranks, more than a job can hold (4096)");
	BAD("invalid value '2x2x2,4096x4096x4096' for --layouts: '4096x4096x4096' has 68719476736 ranks, "
	    "more than a job can hold (4096)", "--layouts", "2x2x2,4096x4096x4096");
	assert_int_equal(dptp_layouts_parse("4096x1x1,1x1x4096", 4096, lay, DPTP_MAX_LAYOUTS, &n, &err), 0);
}

static void test_bad_names(void **state)
{
	BAD("invalid value 'foo' for --checks: unknown check 'foo' (see --list)", "--checks", "foo");
	BAD("invalid value 'opid,bogus' for --checks: unknown check 'bogus' (see --list)",
	    "--checks=opid,bogus");
	BAD("invalid value 'opid,,dispatch' for --checks: empty check name", "--checks", "opid,,dispatch");
	BAD("invalid value '' for --checks: empty check name", "--checks=");
	BAD("invalid value 'opid,opid' for --checks: check 'opid' given twice", "--checks", "opid,opid");
	BAD("invalid value 'ALL' for --checks: unknown check 'ALL' (see --list)", "--checks", "ALL");
	BAD("invalid value 'bad' for --inject: unknown fault 'bad' (see --list)", "--inject", "bad");
	BAD("invalid value 'opid-seeded,nope' for --inject: unknown fault 'nope' (see --list)",
	    "--inject=opid-seeded,nope");
	BAD("invalid value 'gpu' for --backend: expected auto, host or cuda", "--backend", "gpu");
	BAD("invalid value 'HOST' for --backend: expected auto, host or cuda", "--backend", "HOST");
	BAD("invalid value 'fp8' for --dtype: expected bf16, fp16 or fp32", "--dtype", "fp8");
	BAD("invalid value 'xml' for --format: expected text, json or junit", "--format", "xml");
	BAD("invalid value '' for --format: expected text, json or junit", "--format=");
	BAD("invalid value '' for --output: empty file name", "--output=");
}

static void test_usage_errors(void **state)
{
	BAD("missing argument for --tp", "--tp");
	BAD("missing argument for --output", "--bench", "--output");
	BAD("missing argument for --checks", "--checks");
	BAD("unrecognized option '--foo'", "--foo");
	BAD("unrecognized option '--foo'", "--foo=3");
	BAD("unrecognized option '--tp2'", "--tp2", "1");
	BAD("unrecognized option '-x'", "-x");
	BAD("unrecognized option '-x'", "-vx");
	BAD("unrecognized option '-t'", "-t", "2");
	BAD("ambiguous option '--t' (could be --tp, --tokens, --timeout)", "--t", "2");
	BAD("ambiguous option '--ver' (could be --verbose, --version)", "--ver");
	BAD("option '--bench' takes no argument", "--bench=1");
	BAD("option '--verbose' takes no argument", "--verbose=2");
	BAD("option '--help' takes no argument", "--help=yes");
	BAD("unexpected argument 'foo'", "foo");
	BAD("unexpected argument 'foo'", "--tp", "2", "foo", "--dp", "2");
	BAD("unexpected argument 'x'", "--", "x");
	BAD("unexpected argument '-'", "-");
	/* the first error wins, and nothing after it is parsed */
	BAD("invalid value 'a' for --tp: not a number", "--tp", "a", "--dp", "b");
}

/* getopt's state is reset on every call: errors do not leak into the next
 * parse, and the same argv parses the same way twice. */
static void test_repeatable(void **state)
{
	struct dptp_options o;
	struct dptp_err err;
	for (int i = 0; i < 3; i++) {
		assert_int_equal(PARSE(&o, &err, "-vx"), -EINVAL);
		assert_int_equal(PARSE(&o, &err, "--tp", "2", "-v"), 0);
		assert_int_equal(o.tp, 2);
		assert_int_equal(o.verbose, 1);
		assert_int_equal(PARSE(&o, &err, "--tp"), -EINVAL);
		assert_int_equal(PARSE(&o, &err, "--dp", "4"), 0);
		assert_int_equal(o.dp, 4);
		assert_int_equal(o.tp, 0);
	}
}

/* Fills *out (caller frees) with the --help text. */
static void usage_text(char **out)
{
	size_t len = 0;
	FILE *f = open_memstream(out, &len);
	assert_non_null(f);
	dptp_options_usage(f);
	assert_int_equal(fclose(f), 0);
}

static void test_usage(void **state)
{
	static const char *const longs[] = { "dp", "tp", "pp", "checks", "inject", "backend",
		"dtype", "tokens", "hidden", "seed", "timeout", "eps", "format", "output",
		"bench", "list", "verbose", "version", "help" };
	char *u = NULL;
	usage_text(&u);
	assert_non_null(strstr(u, "usage: dptp-check"));
	for (size_t i = 0; i < DPTP_ARRAY_LEN(longs); i++) {
		char opt[64];
		snprintf(opt, sizeof(opt), "--%s", longs[i]);
		const char *p = strstr(u, opt);
		assert_non_null(p);
		/* an option line: the name is followed by a space or newline */
		bool found = false;
		for (; p; p = strstr(p + 1, opt))
			if (p[strlen(opt)] == ' ' || p[strlen(opt)] == '\n')
				found = true;
		assert_true(found);
	}
	assert_non_null(strstr(u, "-v, --verbose"));
	assert_non_null(strstr(u, "-h, --help"));
	assert_non_null(strstr(u, "--backend auto|host|cuda"));
	for (int i = 0; i < dptp_nchecks; i++)
		assert_non_null(strstr(u, dptp_check_name(i)));
	for (int i = 0; i < DPTP_NFAULTS; i++)
		assert_non_null(strstr(u, dptp_faults[i].name));
	/* lines fit a terminal */
	for (const char *line = u; *line;) {
		size_t n = strcspn(line, "\n");
		if (n > 80)
			fail_msg("--help line over 80 columns: %.*s", (int)n, line);
		line += n + (line[n] == '\n');
	}
	free(u);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_every_option_separate),
		cmocka_unit_test(test_every_option_equals),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_bad_numbers),
		cmocka_unit_test(test_bad_names),
		cmocka_unit_test(test_parse_decimal),
		cmocka_unit_test(test_layouts),
		cmocka_unit_test(test_usage_errors),
		cmocka_unit_test(test_repeatable),
		cmocka_unit_test(test_usage),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
