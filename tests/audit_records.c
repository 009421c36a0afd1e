/* The audit analysis's unit tests: records written by hand (audit_records.h). */
#include "audit_records.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/util.h"

char arec_dir[64];
struct audit_report arec_rep;

int arec_setup(void **state)
{
	(void)state;
	snprintf(arec_dir, sizeof(arec_dir), "/tmp/test_audit_XXXXXX");
	memset(&arec_rep, 0, sizeof(arec_rep));
	return mkdtemp(arec_dir) ? 0 : -1;
}

int arec_teardown(void **state)
{
	(void)state;
	audit_report_release(&arec_rep);
	dptp_rm_tree(arec_dir);
	return 0;
}

__attribute__((format(printf, 2, 0)))
static void append(const char *name, const char *fmt, va_list ap)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", arec_dir, name);
	char *line = NULL;
	int n = vasprintf(&line, fmt, ap);
	assert_true(n >= 0);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	fputs(line, f);
	fputc('\n', f);
	fclose(f);
	free(line);
}

void arec(int pid, const char *kind, const char *fmt, ...)
{
	char name[64];
	snprintf(name, sizeof(name), "a0.p%d.%s.jsonl", pid, kind);
	va_list ap;
	va_start(ap, fmt);
	append(name, fmt, ap);
	va_end(ap);
}

void arec_launcher(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	append("launcher.jsonl", fmt, ap);
	va_end(ap);
}

void arec_rank(int r, int world)
{
	int pid = 1000 + r;
	arec(pid, "c", "{\"k\":\"hello\",\"rec\":\"c\",\"rank\":%d,\"world\":%d,\"local_rank\":%d,\"pid\":%d,\"ppid\":999,"
		"\"worker\":true,\"py\":true,\"exe\":\"/usr/bin/python3\",\"img\":0,\"host\":\"h\",\"att\":0,\"t\":0.1}",
		r, world, r, pid);
	arec(pid, "py", "{\"k\":\"hello\",\"rec\":\"py\",\"rank\":%d,\"world\":%d,\"local_rank\":%d,\"pid\":%d,\"ppid\":999,"
		"\"worker\":true,\"flags\":\"\",\"pre\":false,\"host\":\"h\",\"att\":0,\"t\":0.2}", r, world, r, pid);
	arec(pid, "py", "{\"k\":\"world\",\"id\":\"h:29500\",\"size\":%d,\"rank\":%d,\"backend\":\"gloo\",\"timeout\":1800,\"t\":0.5}",
		world, r);
	if (world == 4) {
		arec(pid, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:1\",\"t\":0.6}", r / 2 * 2, r / 2 * 2 + 1);
		arec(pid, "py", "{\"k\":\"group\",\"g\":[%d,%d],\"gn\":0,\"site\":\"m.py:2\",\"t\":0.7}", r % 2, r % 2 + 2);
	}
}

void arec_end(int r)
{
	arec(1000 + r, "py", "{\"k\":\"end\",\"how\":\"atexit\",\"code\":0,\"records\":9,\"lost\":0,\"t\":99}");
	arec(1000 + r, "c", "{\"k\":\"end\",\"how\":\"exit\",\"code\":0,\"records\":3,\"lost\":0,\"t\":99.5}");
}

void arec_analyze(int hung_attempt)
{
	struct dptp_err err = {0};
	audit_report_release(&arec_rep);
	assert_int_equal(audit_analyze_job(arec_dir, NULL, hung_attempt, &arec_rep, &err), 0);
}

void arec_release(void)
{
	audit_report_release(&arec_rep);
}

size_t arec_count(size_t w, char mech)
{
	size_t n = 0;
	assert_true(w < arec_rep.nw);
	for (size_t i = 0; i < arec_rep.w[w].nf; i++)
		n += arec_rep.w[w].f[i].mech == mech;
	return n;
}

bool arec_gap(size_t w, const char *s)
{
	const struct audit_gap *g = w == SIZE_MAX ? arec_rep.gaps : arec_rep.w[w].gaps;
	size_t n = w == SIZE_MAX ? arec_rep.ngaps : arec_rep.w[w].ngaps;
	for (size_t i = 0; i < n; i++)
		if (strstr(g[i].why, s))
			return true;
	return false;
}

void arec_print(void)
{
	for (size_t w = 0; w < arec_rep.nw; w++) {
		const struct audit_result *r = &arec_rep.w[w];
		print_message("# world '%s' att %d size %d: %zu findings, %zu gaps\n", r->world_id, r->attempt, r->world, r->nf,
			r->ngaps);
		for (size_t i = 0; i < r->nf; i++)
			print_message("#   %c [%s] %s\n", r->f[i].mech, r->f[i].site, r->f[i].detail);
		for (size_t i = 0; i < r->ngaps; i++)
			print_message("#   gap rank %d pid %d: %s\n", r->gaps[i].rank, (int)r->gaps[i].pid, r->gaps[i].why);
	}
	for (size_t i = 0; i < arec_rep.ngaps; i++)
		print_message("#   job gap rank %d pid %d: %s\n", arec_rep.gaps[i].rank, (int)arec_rep.gaps[i].pid,
			arec_rep.gaps[i].why);
}

bool arec_sanitized(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
	return true;
#endif
#endif
	return false;
}

int arec_run(const struct CMUnitTest *tests, size_t n, size_t limited)
{
	return _cmocka_run_group_tests("tests", tests, n - (arec_sanitized() ? limited : 0), NULL, NULL);
}

void arec_analyze_limited(int mib, size_t nf, size_t ngaps)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = {(rlim_t)mib << 20, (rlim_t)mib << 20};
		struct audit_report rep;
		struct dptp_err err = {0};
		if (setrlimit(RLIMIT_DATA, &rl) < 0)
			_exit(3);
		int rc = audit_analyze_job(arec_dir, NULL, -1, &rep, &err);
		_exit(rc < 0 ? 1 : rep.nw == 1 && rep.w[0].nf == nf && rep.w[0].ngaps == ngaps ? 0 : 2);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}
