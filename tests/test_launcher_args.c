/* Unit tests of dptp-run's command line, template substitution and failure
 * report (launcher/cli/run_opts.c, agent/env.c, output/failure.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/run_opts.h"
#include "agent/env.h"
#include "output/failure.h"

static FILE *sink;

static enum run_opts_result parse(struct run_opts *o, const char **args)
{
	static char *argv[32]; /* o keeps pointers into it */
	argv[0] = "dptp-run";
	int argc = 1;
	for (; args[argc - 1]; argc++)
		argv[argc] = (char *)args[argc - 1];
	return run_opts_parse(o, argc, argv, sink, sink);
}

static void test_defaults(void **state)
{
	struct run_opts o;
	const char *a[] = {"train.py", "--lr", "1", NULL};
	unsetenv("PET_NPROC_PER_NODE");
	assert_int_equal(parse(&o, a), RUN_OPTS_OK);
	assert_int_equal(o.nproc, 1);
	assert_int_equal(o.max_nodes, 1);
	assert_string_equal(o.rdzv_backend, "static");
	assert_string_equal(o.rdzv_id, "none");
	assert_string_equal(o.role, "default");
	assert_string_equal(o.master_addr, "127.0.0.1");
	assert_int_equal(o.master_port, 29500);
	assert_int_equal(o.nsignals, 4);
	assert_string_equal(o.script, "train.py");
	assert_int_equal(o.nscript_args, 2);
	assert_string_equal(o.script_args[0], "--lr");
	run_opts_release(&o);
}

static void test_spellings(void **state)
{
	const char *forms[][4] = {
		{"--nproc-per-node", "4", "t", NULL},
		{"--nproc_per_node=4", "t", NULL},
		{"--nproc-p", "4", "t", NULL},
		{"--nproc_per=4", "t", NULL},
	};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(forms); i++) {
		struct run_opts o;
		assert_int_equal(parse(&o, forms[i]), RUN_OPTS_OK);
		assert_int_equal(o.nproc, 4);
		run_opts_release(&o);
	}
}

static void test_short_and_remainder(void **state)
{
	struct run_opts o;
	const char *a[] = {"-r3", "-t=1", "-m", "mod", "--nproc-per-node=9", NULL};
	assert_int_equal(parse(&o, a), RUN_OPTS_OK);
	assert_int_equal(run_opts_std_for(&o.redirects, 5), 3);
	assert_int_equal(run_opts_std_for(&o.tee, 0), 1);
	assert_true(o.module);
	assert_int_equal(o.nproc, 1);
	assert_int_equal(o.nscript_args, 1);
	run_opts_release(&o);
}

/* argparse removes one "--": one right after the script, unless one came before it */
static void test_dashdash(void **state)
{
	struct run_opts o;
	const char *a[] = {"-m", "scripts.base_train", "--", "--depth=20", "--", "x", NULL};
	assert_int_equal(parse(&o, a), RUN_OPTS_OK);
	assert_string_equal(o.script, "scripts.base_train");
	assert_int_equal(o.nscript_args, 3);
	assert_string_equal(o.script_args[0], "--depth=20");
	assert_string_equal(o.script_args[1], "--");
	assert_string_equal(o.script_args[2], "x");
	run_opts_release(&o);
	const char *b[] = {"--", "t.py", "--", "--x", NULL};
	assert_int_equal(parse(&o, b), RUN_OPTS_OK);
	assert_string_equal(o.script, "t.py");
	assert_int_equal(o.nscript_args, 2);
	assert_string_equal(o.script_args[0], "--");
	run_opts_release(&o);
	/* one further on is the script's (torchrun: "echo a -- b" prints "a -- b") */
	const char *c[] = {"--no-python", "echo", "a", "--", "b", NULL};
	assert_int_equal(parse(&o, c), RUN_OPTS_OK);
	assert_int_equal(o.nscript_args, 3);
	assert_string_equal(o.script_args[1], "--");
	run_opts_release(&o);
	const char *d[] = {"t.py", "--", "--", "b", NULL};
	assert_int_equal(parse(&o, d), RUN_OPTS_OK);
	assert_int_equal(o.nscript_args, 2);
	assert_string_equal(o.script_args[0], "--");
	run_opts_release(&o);
}

static void test_pet(void **state)
{
	struct run_opts o;
	const char *a[] = {"t", NULL};
	const char *b[] = {"--nproc-per-node=2", "t", NULL};
	setenv("PET_NPROC_PER_NODE", "3", 1);
	setenv("PET_STANDALONE", "1", 1);
	assert_int_equal(parse(&o, a), RUN_OPTS_OK);
	assert_int_equal(o.nproc, 3);
	assert_true(o.standalone);
	run_opts_release(&o);
	assert_int_equal(parse(&o, b), RUN_OPTS_OK);
	assert_int_equal(o.nproc, 2);
	run_opts_release(&o);
	setenv("PET_STANDALONE", "yes", 1);
	assert_int_equal(parse(&o, a), RUN_OPTS_USAGE);
	unsetenv("PET_NPROC_PER_NODE");
	unsetenv("PET_STANDALONE");
}

static void test_errors(void **state)
{
	const char *bad[][4] = {
		{NULL},
		{"--n=1", "t", NULL},
		{"--nnodes=1:2", "t", NULL},
		{"--nnodes=x", "t", NULL},
		{"--nproc-per-node=two", "t", NULL},
		{"--no-python", "-m", "t", NULL},
		{"--standalone=1", "t", NULL},
		{"--max-restarts", "-1", "t", NULL},
		{"--start-method=x", "t", NULL},
		{"-r", "0:4", "t", NULL},
		{"--rdzv-conf=timeout", "t", NULL},
		{"--bogus", "t", NULL},
		{"--master-port=70000", "t", NULL},
	};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(bad); i++) {
		struct run_opts o;
		assert_int_equal(parse(&o, bad[i]), RUN_OPTS_USAGE);
	}
}

static void test_std(void **state)
{
	struct run_opts_std s;
	struct dptp_err err = {0};
	assert_int_equal(run_opts_std_parse("0:1,3:2", &s, &err), 0);
	assert_int_equal(run_opts_std_for(&s, 0), 1);
	assert_int_equal(run_opts_std_for(&s, 1), 0);
	assert_int_equal(run_opts_std_for(&s, 3), 2);
	assert_int_equal(run_opts_std_for(&s, 12), 0);
	assert_true(run_opts_std_parse("0:1,", &s, &err) < 0);
	assert_true(run_opts_std_parse("12:1", &s, &err) < 0);
	assert_non_null(strstr(err.msg, "does not match"));
}

static void test_endpoint(void **state)
{
	char host[64];
	int port;
	struct dptp_err err = {0};
	assert_int_equal(run_opts_parse_endpoint("node1:29400", host, sizeof(host), &port, &err), 0);
	assert_string_equal(host, "node1");
	assert_int_equal(port, 29400);
	assert_int_equal(run_opts_parse_endpoint("[::1]:5", host, sizeof(host), &port, &err), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 5);
	assert_int_equal(run_opts_parse_endpoint("h", host, sizeof(host), &port, &err), 0);
	assert_int_equal(port, -1);
	assert_true(run_opts_parse_endpoint("h:x", host, sizeof(host), &port, &err) < 0);
}

static void test_template(void **state)
{
	const char *k[] = {"role_name", "rank", "local_rank"};
	const char *v[] = {"trainer", "5", "1"};
	char *s = env_template_subst("[${role_name}$local_rank]:$rank $$ ${other} $ $x ${rank", k, v, 3);
	assert_string_equal(s, "[trainer1]:5 $ ${other} $ $x ${rank");
	free(s);
}

static void test_error_json(void **state)
{
	char *msg;
	long long ts;
	assert_int_equal(failure_parse_error_json(
		"{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": "
		"{\"py_callstack\": \"Traceback:\\n  x\\nValueError: boom\\n\", \"timestamp\": \"1701525202\"}}}",
		&msg, &ts), 0);
	assert_string_equal(msg, "Traceback:\n    x\n  ValueError: boom\n  ");
	assert_int_equal(ts, 1701525202);
	free(msg);
	assert_int_equal(failure_parse_error_json("{\"message\": \"plain \\u00e9\", \"timestamp\": 12}", &msg, &ts), 0);
	assert_string_equal(msg, "plain \xc3\xa9");
	assert_int_equal(ts, 12);
	free(msg);
	assert_int_equal(failure_parse_error_json("{\"nope\": 1}", &msg, &ts), -1);
	/* nested without py_callstack: torchrun shows message.message */
	assert_int_equal(failure_parse_error_json(
		"{\"message\": {\"message\": \"RuntimeError: a\\nb\", \"extraInfo\": {\"timestamp\": 7}}}",
		&msg, &ts), 0);
	assert_string_equal(msg, "RuntimeError: a\n  b");
	assert_int_equal(ts, 7);
	free(msg);
	/* nested without extraInfo, and without either: message, then <N/A> */
	assert_int_equal(failure_parse_error_json("{\"message\": {\"message\": \"only\"}}", &msg, &ts), 0);
	assert_string_equal(msg, "only");
	assert_int_equal(ts, 0);
	free(msg);
	assert_int_equal(failure_parse_error_json("{\"message\": {}}", &msg, &ts), 0);
	assert_string_equal(msg, "<N/A>");
	free(msg);
	assert_int_equal(failure_parse_error_json("", &msg, &ts), -1);
	assert_null(msg);
	/* an empty py_callstack is shown empty; an empty plain message is none */
	assert_int_equal(failure_parse_error_json(
		"{\"message\": {\"message\": \"m\", \"extraInfo\": {\"py_callstack\": \"\", \"timestamp\": 3}}}",
		&msg, &ts), 0);
	assert_string_equal(msg, "");
	free(msg);
	assert_int_equal(failure_parse_error_json("{\"message\": \"\", \"timestamp\": 3}", &msg, &ts), 0);
	assert_null(msg);
	assert_int_equal(ts, 3);
}

static void test_error_json_code(void **state)
{
	char *s = failure_error_json_with_code("{\"message\": {\"message\": \"x\", \"extraInfo\": {\"timestamp\": 1}}}", 1);
	assert_string_equal(s, "{\"message\": {\"message\": \"x\", \"extraInfo\": {\"timestamp\": 1}, \"errorCode\": 1}}");
	free(s);
	s = failure_error_json_with_code("{\"message\": {}}", -11);
	assert_string_equal(s, "{\"message\": {\"errorCode\": -11}}");
	free(s);
	s = failure_error_json_with_code("{\"message\": \"plain\", \"timestamp\": 3}", 1);
	assert_string_equal(s, "{\"message\": \"plain\", \"timestamp\": 3}");
	free(s);
	assert_null(failure_error_json_with_code("[1]", 1));
}

static void test_report(void **state)
{
	struct failure f[2];
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	failure_init(&f[0], 1, 1, 680, 3, NULL, NULL);
	failure_init(&f[1], 0, 0, 679, -15, NULL, NULL);
	f[0].timestamp = f[1].timestamp = 0;
	failure_report_write(m, "sh", f, 2, "localhost");
	fclose(m);
	assert_non_null(strstr(buf, "============================================================\nsh FAILED\n"
		"------------------------------------------------------------\nFailures:\n[1]:\n"));
	assert_non_null(strstr(buf, "  exitcode  : -15 (pid: 679)\n  error_file: <N/A>\n"
		"  traceback : Signal 15 (SIGTERM) received by PID 679\n"));
	assert_non_null(strstr(buf, "Root Cause (first observed failure):\n[0]:\n"));
	assert_non_null(strstr(buf, "  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 680)\n"));
	free(buf);
	failure_release(&f[0]);
	failure_release(&f[1]);
}

/* --help is generated from the parser's table: every spelling the parser
 * takes is in it, text lines stay within argparse's 78 columns. */
static void test_help_from_table(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	run_opts_print_help(m);
	fclose(m);
	assert_non_null(strstr(buf, "usage: dptp-run [-h] [--nnodes NNODES]"));
	assert_non_null(strstr(buf, "\n                [--numa-binding {node,socket,exclusive,core-complex}]\n"));
	assert_non_null(strstr(buf, "\n  --role ROLE           User-defined role for the workers.\n"));
	assert_non_null(strstr(buf, "\n  --numa-binding {node,socket,exclusive,core-complex}, "
		"--numa_binding {node,socket,exclusive,core-complex}\n                        "));
	for (char *l = buf, *nl; (nl = strchr(l, '\n')); l = nl + 1)
		if (strncmp(l, "  -", 3))
			assert_true(nl - l <= 78);
	free(buf);
}

/* Accepted options that dptp-run does not act on are each warned about
 * once; the defaults are not. */
static void test_unsupported_warned(void **state)
{
	struct run_opts o;
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	char *a[] = {"dptp-run", "--numa-binding=node", "--logs-specs", "x", "--rdzv-backend=etcd",
		"--event-log-handler=console", "--duplicate-stderr-filters=E", "t.py", NULL};
	assert_int_equal(run_opts_parse(&o, 8, a, m, m), RUN_OPTS_OK);
	fclose(m);
	static const char *const want[] = {"--rdzv-backend=etcd:"};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(want); i++) {
		const char *hit = strstr(buf, want[i]);
		assert_non_null(hit);
		assert_null(strstr(hit + 1, want[i]));
	}
	assert_null(strstr(buf, "stdout"));
	assert_null(strstr(buf, "numa")); /* acted on: no warning */
	assert_null(strstr(buf, "logs-specs")); /* looked up when the run starts */
	assert_null(strstr(buf, "duplicate"));
	assert_null(strstr(buf, "event"));
	run_opts_release(&o);
	free(buf);
	char *b[] = {"dptp-run", "t.py", NULL};
	buf = NULL;
	m = open_memstream(&buf, &len);
	assert_int_equal(run_opts_parse(&o, 2, b, m, m), RUN_OPTS_OK);
	fclose(m);
	assert_string_equal(buf, "");
	run_opts_release(&o);
	free(buf);
}

/* The OMP_NUM_THREADS warning leaves the launcher's own environment alone:
 * the workers get the variables from env_build's spec. */
static void test_launcher_env_untouched(void **state)
{
	struct run_opts o;
	char *buf = NULL;
	size_t len = 0;
	char *a[] = {"dptp-run", "--nproc-per-node=2", "t.py", NULL};
	unsetenv("OMP_NUM_THREADS");
	unsetenv("TORCHELASTIC_SIGNALS_TO_HANDLE");
	unsetenv("PET_NPROC_PER_NODE");
	FILE *m = open_memstream(&buf, &len);
	assert_int_equal(run_opts_parse(&o, 3, a, m, m), RUN_OPTS_OK);
	env_launcher_setup(&o, m);
	fclose(m);
	assert_non_null(strstr(buf, "Setting OMP_NUM_THREADS environment variable for each process to be 1"));
	assert_null(getenv("OMP_NUM_THREADS"));
	assert_null(getenv("TORCHELASTIC_SIGNALS_TO_HANDLE"));
	run_opts_release(&o);
	free(buf);
}

/* --audit's options as parsed: the world known at start (a fixed node
 * count, more than one worker), --audit-keep; bad values refused by
 * audit_create before the job, naming the value */
static void test_audit_opts(void **state)
{
	struct run_opts o;
	struct audit *a = NULL;
	struct dptp_err err = {0};
	const char *fixed[] = {"--nnodes", "2", "--nproc-per-node", "3", "--audit", "--audit-keep", "--audit-hang", "0",
		"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "x.py", NULL};
	const char *elastic[] = {"--nnodes", "1:2", "--nproc-per-node", "3", "--audit", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", "h:1", "x.py", NULL};
	const char *one[] = {"--audit", "--audit-layout", "2x1x2", "x.py", NULL};
	(void)state;
	assert_int_equal(parse(&o, fixed), RUN_OPTS_OK);
	assert_true(o.audit_opts.on && o.audit_opts.keep);
	assert_int_equal(o.audit_opts.world, 6);
	assert_string_equal(o.audit_opts.hang, "0");
	o.audit_opts.layout = "2x1x2";
	assert_int_equal(audit_create(&a, &o.audit_opts, &err), -EINVAL);
	assert_null(a);
	assert_string_equal(err.msg, "--audit-layout '2x1x2' is 4 ranks; the job's world is 6 (nnodes x nproc-per-node)");
	o.audit_opts.layout = "4294967302x1x1"; /* 6 after a 32-bit wrap */
	assert_int_equal(audit_create(&a, &o.audit_opts, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "'4294967302x1x1': expected DPxPPxTP in decimal"));
	o.audit_opts.layout = "6x+1x1";
	assert_int_equal(audit_create(&a, &o.audit_opts, &err), -EINVAL);
	run_opts_release(&o);
	assert_int_equal(parse(&o, elastic), RUN_OPTS_OK);
	assert_int_equal(o.audit_opts.world, 0); /* elastic: not known at start */
	run_opts_release(&o);
	/* one worker may start its own ranks (mp.spawn): any layout */
	assert_int_equal(parse(&o, one), RUN_OPTS_OK);
	assert_int_equal(o.audit_opts.world, 0);
	run_opts_release(&o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_launcher_env_untouched),
		cmocka_unit_test(test_unsupported_warned),
		cmocka_unit_test(test_help_from_table),
		cmocka_unit_test(test_spellings),
		cmocka_unit_test(test_short_and_remainder),
		cmocka_unit_test(test_dashdash),
		cmocka_unit_test(test_error_json_code),
		cmocka_unit_test(test_pet),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_std),
		cmocka_unit_test(test_endpoint),
		cmocka_unit_test(test_template),
		cmocka_unit_test(test_error_json),
		cmocka_unit_test(test_report),
		cmocka_unit_test(test_audit_opts),
	};
	sink = fopen("/dev/null", "w");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
