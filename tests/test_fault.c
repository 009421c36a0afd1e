/* The fault table: parsing --inject, and the table's own claim of where each
 * fault acts (its `where` names a function of a file that exists, and no
 * other lib/ file makes that fault's decision). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <ftw.h>

#include "base/fault.h"
#include "base/dtype.h"

static void test_parse(void **state)
{
	dptp_fault_set s = 123;
	struct dptp_err err = {0};
	assert_int_equal(dptp_fault_parse("", &s, &err), 0);
	assert_int_equal(s, 0);
	assert_int_equal(dptp_fault_parse(NULL, &s, &err), 0);
	assert_int_equal(s, 0);
	assert_int_equal(dptp_fault_parse("none", &s, &err), 0);
	assert_int_equal(s, 0);
	assert_int_equal(dptp_fault_parse("all", &s, &err), 0);
	assert_int_equal(s, (1u << DPTP_NFAULTS) - 1);
	assert_int_equal(dptp_fault_parse("opid-seeded,dispatch-ep-group", &s, &err), 0);
	assert_int_equal(s, (1u << DPTP_FAULT_OPID_SEEDED) | (1u << DPTP_FAULT_DISPATCH_EP_GROUP));
	assert_true(dptp_fault_on(s, DPTP_FAULT_OPID_SEEDED));
	assert_false(dptp_fault_on(s, DPTP_FAULT_BCAST_GLOBAL_SRC));
	assert_string_equal(err.msg, "");
}

static void test_parse_errors(void **state)
{
	static const struct { const char *in, *msg; } bad[] = {
		{ "nope", "unknown fault 'nope' (see --list)" },
		{ "opid-seeded,nope", "unknown fault 'nope' (see --list)" },
		{ "opid-seeded,opid-seeded", "fault 'opid-seeded' given twice" },
		{ "opid-seeded,", "invalid fault list 'opid-seeded,' (empty or over-long name)" },
		{ ",opid-seeded", "invalid fault list ',opid-seeded' (empty or over-long name)" },
		{ "All", "unknown fault 'All' (see --list)" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dptp_fault_set s = 7;
		struct dptp_err err = {0};
		assert_int_equal(dptp_fault_parse(bad[i].in, &s, &err), -EINVAL);
		assert_string_equal(err.msg, bad[i].msg);
		assert_int_equal(s, 7); /* untouched */
	}
	char longname[200];
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	struct dptp_err err = {0};
	dptp_fault_set s;
	assert_int_equal(dptp_fault_parse(longname, &s, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "(empty or over-long name)"));
}

static void test_table(void **state)
{
	for (int i = 0; i < DPTP_NFAULTS; i++) {
		const struct dptp_fault_desc *f = &dptp_faults[i];
		assert_non_null(f->name);
		assert_int_equal(dptp_fault_lookup(f->name), i);
		assert_true(f->bug >= 0 && f->bug <= 5);
		assert_non_null(f->mech);
		assert_non_null(f->bugs);
		assert_non_null(f->check);
		assert_non_null(f->summary);
		assert_non_null(f->symptom);
		assert_non_null(f->where);
	}
	assert_int_equal(dptp_fault_lookup("nope"), -1);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t cap = 0, len = 0, n;
	char chunk[4096];
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
		if (len + n + 1 > cap) {
			cap = (len + n + 1) * 2;
			buf = realloc(buf, cap);
			assert_non_null(buf);
		}
		memcpy(buf + len, chunk, n);
		len += n;
	}
	fclose(f);
	if (buf)
		buf[len] = 0;
	return buf;
}

static const char *root(void)
{
	const char *r = getenv("DPTP_SOURCE_ROOT");
	assert_non_null(r);
	return r;
}

/* The enum names of the faults, as written in lib/: DPTP_FAULT_<NAME>. */
static void enum_name(const char *fault, char *buf, size_t n)
{
	snprintf(buf, n, "DPTP_FAULT_");
	size_t o = strlen(buf);
	for (const char *p = fault; *p && o + 1 < n; p++)
		buf[o++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
	buf[o] = 0;
}

static int hits[DPTP_NFAULTS];
static char hit_file[DPTP_NFAULTS][512];

static int scan(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	size_t n = strlen(path);
	if (type != FTW_F || n < 2 || strcmp(path + n - 2, ".c") != 0)
		return 0;
	const char *rel = path + strlen(root()) + 1;
	/* the table itself, and the context that hands flags to what it builds */
	if (strcmp(rel, "lib/base/fault.c") == 0 || strcmp(rel, "lib/checks/ctx.c") == 0)
		return 0;
	char *text = slurp(path);
	for (int i = 0; text && i < DPTP_NFAULTS; i++) {
		char en[64];
		enum_name(dptp_faults[i].name, en, sizeof(en));
		for (const char *p = text; (p = strstr(p, en)) != NULL; p += strlen(en)) {
			hits[i]++;
			snprintf(hit_file[i], sizeof(hit_file[i]), "%s", rel);
		}
	}
	free(text);
	return 0;
}

/* "where" is "FILE FUNCTION()": FUNCTION is defined in FILE; a fault whose
 * enum lib/ reads (outside the table and the context) reads it once, there. */
static void test_where(void **state)
{
	for (int i = 0; i < DPTP_NFAULTS; i++) {
		char file[256], fn[128], path[512];
		assert_int_equal(sscanf(dptp_faults[i].where, "%255s %127[a-z_0-9]()", file, fn), 2);
		snprintf(path, sizeof(path), "%s/%s", root(), file);
		char *text = slurp(path);
		if (!text)
			fail_msg("%s: where names %s, which does not exist", dptp_faults[i].name, file);
		/* a definition: a line at column 0 naming fn( that does not end in ';' */
		bool found = false;
		for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
			char *at = strstr(line, fn);
			size_t len = strlen(line);
			while (len && (line[len - 1] == ' ' || line[len - 1] == '\t'))
				len--;
			found = at && line[0] != ' ' && line[0] != '\t' && line[0] != '#' && line[0] != '/' &&
				(at == line || at[-1] == ' ' || at[-1] == '*') && at[strlen(fn)] == '(' &&
				len && line[len - 1] != ';';
		}
		if (!found)
			fail_msg("%s: where names %s(), which %s does not define", dptp_faults[i].name, fn, file);
		free(text);
	}
	memset(hits, 0, sizeof(hits));
	char lib[512];
	snprintf(lib, sizeof(lib), "%s/lib", root());
	assert_int_equal(nftw(lib, scan, 16, FTW_PHYS), 0);
	for (int i = 0; i < DPTP_NFAULTS; i++) {
		if (hits[i] == 0)
			continue; /* acts through a flag of what the context builds */
		if (hits[i] > 1)
			fail_msg("%s: its decision is read %d times in lib/", dptp_faults[i].name, hits[i]);
		char file[256];
		sscanf(dptp_faults[i].where, "%255s", file);
		if (strcmp(file, hit_file[i]) != 0)
			fail_msg("%s: acts in %s, but its where says %s", dptp_faults[i].name, hit_file[i], file);
	}
}

/* Squeezes runs of blanks (scdoc wraps lines) into one space, drops the
 * backslash of scdoc's escapes. */
static void squeeze(char *s)
{
	char *o = s;
	for (char *p = s; *p; p++) {
		if (*p == '\\')
			continue;
		bool blank = *p == ' ' || *p == '\n' || *p == '\t';
		if (blank && o > s && o[-1] == ' ')
			continue;
		*o++ = blank ? ' ' : *p;
	}
	*o = 0;
}

/* The man page's FAULTS section names every fault with its mechanism, its
 * real bugs and its symptom, as --list does (the same table). */
static void test_man_faults(void **state)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/man/dptp-check.1.scd", root());
	char *man = slurp(path);
	assert_non_null(man);
	squeeze(man);
	for (int i = 0; i < DPTP_NFAULTS; i++) {
		const struct dptp_fault_desc *f = &dptp_faults[i];
		char want[2048], head[128];
		snprintf(head, sizeof(head), "*%s* ", f->name);
		snprintf(want, sizeof(want), "Mechanism %s; real bugs: %s. Symptom users search for: %s", f->mech, f->bugs,
			 f->symptom);
		squeeze(want);
		size_t n = strlen(want);
		if (n && want[n - 1] == '.')
			want[n - 1] = 0;
		const char *at = strstr(man, head);
		if (!at)
			fail_msg("man page: no FAULTS entry for %s", f->name);
		/* the entry ends where the next fault's entry begins */
		const char *next = NULL;
		for (int k = 0; k < DPTP_NFAULTS; k++) {
			char other[128];
			snprintf(other, sizeof(other), "*%s* ", dptp_faults[k].name);
			const char *o = k == i ? NULL : strstr(at + strlen(head), other);
			if (o && (!next || o < next))
				next = o;
		}
		const char *got = strstr(at, want);
		if (!got || (next && got > next))
			fail_msg("man page: %s's entry lacks \"%s\"", f->name, want);
	}
	free(man);
}

/* was cli's dptp_dtype_name/dptp_dtype_size, there only for this test */
static void test_dtype_names(void **state)
{
	assert_string_equal(dptp_dtype_name(DPTP_DTYPE_BF16), "bf16");
	assert_string_equal(dptp_dtype_name(DPTP_DTYPE_FP16), "fp16");
	assert_string_equal(dptp_dtype_name(DPTP_DTYPE_FP32), "fp32");
	assert_int_equal(dptp_dtype_bytes(DPTP_DTYPE_BF16), 2);
	assert_int_equal(dptp_dtype_bytes(DPTP_DTYPE_FP16), 2);
	assert_int_equal(dptp_dtype_bytes(DPTP_DTYPE_FP32), 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_where),
		cmocka_unit_test(test_man_faults),
		cmocka_unit_test(test_dtype_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
