/* Report writers: text table, JSON (DESIGN.md schema), JUnit XML, and the
 * atomic file writer. Pure functions of a struct dptp_report. */
#include "report/report.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef DPTP_VERSION
#define DPTP_VERSION "unknown"
#endif

static const char *const status_names[] = {
	[DPTP_SKIP] = "skip",
	[DPTP_PASS] = "pass",
	[DPTP_FAIL] = "fail",
	[DPTP_ERROR] = "error",
	[DPTP_TIMEOUT] = "timeout",
};

const char *dptp_status_name(enum dptp_status s)
{
	if ((unsigned)s < DPTP_ARRAY_LEN(status_names))
		return status_names[s];
	return "error";
}

int dptp_status_parse(const char *name)
{
	if (!name)
		return -1;
	for (size_t i = 0; i < DPTP_ARRAY_LEN(status_names); i++)
		if (strcmp(status_names[i], name) == 0)
			return (int)i;
	return -1;
}

enum dptp_status dptp_status_worst(enum dptp_status a, enum dptp_status b)
{
	return a > b ? a : b;
}

struct dptp_summary dptp_report_summary(const struct dptp_report *r)
{
	struct dptp_summary s = {0};
	for (size_t i = 0; r && i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		for (size_t j = 0; j < rep->nchecks; j++) {
			switch (rep->checks[j].status) {
			case DPTP_PASS: s.pass++; break;
			case DPTP_FAIL: s.fail++; break;
			case DPTP_SKIP: s.skip++; break;
			case DPTP_TIMEOUT: s.timeout++; break;
			case DPTP_ERROR:
			default: s.error++; break;
			}
		}
	}
	return s;
}

/* Unknown status values count as errors, as in the summary. */
static enum dptp_status sane(enum dptp_status s)
{
	return (unsigned)s <= DPTP_TIMEOUT ? s : DPTP_ERROR;
}

enum dptp_status dptp_report_worst(const struct dptp_report *r)
{
	enum dptp_status w = DPTP_SKIP;
	size_t pairs = 0;
	for (size_t i = 0; r && i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		w = dptp_status_worst(w, sane(rep->status));
		pairs += rep->nchecks;
		for (size_t j = 0; j < rep->nchecks; j++)
			w = dptp_status_worst(w, sane(rep->checks[j].status));
	}
	/* nothing checked is no pass: results lost on the way */
	return pairs ? w : DPTP_ERROR;
}

int dptp_report_exit_code(const struct dptp_report *r)
{
	switch (dptp_report_worst(r)) {
	case DPTP_SKIP:
	case DPTP_PASS: return 0;
	case DPTP_FAIL: return 1;
	case DPTP_TIMEOUT: return 4;
	case DPTP_ERROR:
	default: return 3;
	}
}

/* ---- UTF-8 ---------------------------------------------------------- */

/* Strict UTF-8, surrogates refused (base/utf8.h). */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
	return dptp_utf8_next(s, n, 0, cp);
}

/* utf8_next, one step at a time: an invalid byte is one step of NOT_UTF8. */
#define NOT_UTF8 UINT32_MAX
static size_t utf8_step(const unsigned char *s, size_t n, uint32_t *cp)
{
	size_t len = utf8_next(s, n, cp);
	if (len == 0)
		*cp = NOT_UTF8;
	return len ? len : 1;
}

void dptp_json_escape(FILE *f, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	for (size_t i = 0, len; s && i < n; i += len) {
		uint32_t cp;
		len = utf8_step(s + i, n - i, &cp);
		if (cp == NOT_UTF8)
			fputs("\\ufffd", f);
		else if (cp == '"')
			fputs("\\\"", f);
		else if (cp == '\\')
			fputs("\\\\", f);
		else if (cp < 0x20 || cp == 0x7f)
			fprintf(f, "\\u%04x", (unsigned)cp);
		else if (cp == 0x2028 || cp == 0x2029) /* JavaScript line ends */
			fprintf(f, "\\u%04x", (unsigned)cp);
		else
			fwrite(s + i, 1, len, f);
	}
}

static void xml_escape(FILE *f, const char *str, size_t n, bool attr)
{
	const unsigned char *s = (const unsigned char *)str;
	for (size_t i = 0, len; s && i < n; i += len) {
		uint32_t cp;
		len = utf8_step(s + i, n - i, &cp);
		switch (cp) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&apos;", f); break;
		/* A raw CR is folded away by parsers, raw tab/LF in an
		 * attribute become spaces: keep them as references. */
		case '\r': fputs("&#13;", f); break;
		case '\t': fputs(attr ? "&#9;" : "\t", f); break;
		case '\n': fputs(attr ? "&#10;" : "\n", f); break;
		default:
			if (cp == NOT_UTF8 || cp < 0x20 || cp == 0x7f || cp == 0xfffe || cp == 0xffff)
				fputs("\xef\xbf\xbd", f);
			else
				fwrite(s + i, 1, len, f);
		}
	}
}

void dptp_xml_escape(FILE *f, const char *s, size_t n)
{
	xml_escape(f, s, n, false);
}

/* ---- helpers -------------------------------------------------------- */

static const char *or_empty(const char *s)
{
	return s ? s : "";
}

static void json_str(FILE *f, const char *s)
{
	if (!s) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	dptp_json_escape(f, s, strlen(s));
	fputc('"', f);
}

/* JSON has no NaN or infinity; a non-finite time is reported as 0. */
static void json_num(FILE *f, double v)
{
	if (!isfinite(v))
		v = 0;
	fprintf(f, "%.9g", v);
}

static void xml_attr(FILE *f, const char *name, const char *v)
{
	fprintf(f, " %s=\"", name);
	xml_escape(f, or_empty(v), strlen(or_empty(v)), true);
	fputc('"', f);
}

static double finite_or_zero(double v)
{
	return isfinite(v) && v > 0 ? v : 0;
}

static size_t name_len(const struct dptp_check_result *c)
{
	return strnlen(c->name, sizeof(c->name));
}

/* Ranks as "0-3,8,10-11". */
static void write_ranks(FILE *f, const int *ranks, int n)
{
	for (int i = 0; i < n;) {
		int j = i;
		while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
			j++;
		fprintf(f, "%s%d", i ? "," : "", ranks[i]);
		if (j > i)
			fprintf(f, "%s%d", j == i + 1 ? "," : "-", ranks[j]);
		i = j + 1;
	}
}

static int finish(FILE *f)
{
	return ferror(f) ? -EIO : 0;
}

/* ---- JSON ----------------------------------------------------------- */

int dptp_report_write_json(const struct dptp_report *r, FILE *f)
{
	fputs("{\"tool\": ", f);
	json_str(f, r->tool ? r->tool : "dptp-check");
	fputs(", \"version\": ", f);
	json_str(f, r->version ? r->version : DPTP_VERSION);
	fprintf(f, ",\n \"layout\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"tp\": %d},\n",
		r->world, r->dp, r->pp, r->tp);
	fputs(" \"backend\": ", f);
	json_str(f, r->backend);
	fputs(", \"bootstrap\": ", f);
	json_str(f, r->bootstrap);
	if (r->engine) {
		fputs(", \"engine\": ", f);
		json_str(f, r->engine);
	}
	fprintf(f, ", \"seed\": %" PRIu64 ",\n \"inject\": [", r->seed);
	for (size_t i = 0; i < r->ninject; i++) {
		if (i)
			fputs(", ", f);
		json_str(f, r->inject[i]);
	}
	fputs("],\n \"replicas\": [", f);
	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		fprintf(f, "%s\n  {\"dp\": %d, \"ranks\": [", i ? "," : "", rep->dp);
		for (int k = 0; k < rep->nranks; k++)
			fprintf(f, "%s%d", k ? ", " : "", rep->ranks[k]);
		fprintf(f, "], \"status\": \"%s\",\n   \"checks\": [", dptp_status_name(rep->status));
		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			fprintf(f, "%s\n    {\"name\": \"", j ? "," : "");
			dptp_json_escape(f, c->name, name_len(c));
			fprintf(f, "\", \"status\": \"%s\", \"seconds\": ", dptp_status_name(c->status));
			json_num(f, c->seconds);
			fputs(", \"detail\": \"", f);
			dptp_json_escape(f, or_empty(c->detail), strlen(or_empty(c->detail)));
			if (c->status == DPTP_FAIL && c->mech) {
				fputs("\", \"mechanism\": \"", f);
				dptp_json_escape(f, c->mech, strlen(c->mech));
			}
			fputs("\"}", f);
		}
		fputs(rep->nchecks ? "\n   ]}" : "]}", f);
	}
	fputs(r->nreplicas ? "\n ],\n" : "],\n", f);
	if (r->nbench > 0) {
		fputs(" \"bench\": [", f);
		for (size_t i = 0; i < r->nbench; i++) {
			const struct dptp_bench_row *b = &r->bench[i];
			fprintf(f, "%s\n  {\"tp\": %d, \"tokens\": %d, \"hidden\": %d, \"dtype\": ",
				i ? "," : "", b->tp, b->tokens, b->hidden);
			fputc('"', f);
			dptp_json_escape(f, b->dtype, strnlen(b->dtype, sizeof(b->dtype)));
			fputs("\", \"fused_us\": ", f);
			json_num(f, b->fused_us);
			fputs(", \"unfused_us\": ", f);
			json_num(f, b->unfused_us);
			fputs(", \"speedup\": ", f);
			if (b->tp > 1)
				json_num(f, b->speedup);
			else
				fputs("null", f); /* TP 1: nothing is fused */
			fputs(", \"fused_busbw_gbs\": ", f);
			json_num(f, b->fused_busbw_gbs);
			fputs(", \"unfused_busbw_gbs\": ", f);
			json_num(f, b->unfused_busbw_gbs);
			fputc('}', f);
		}
		fputs("\n ],\n", f);
	}
	struct dptp_summary s = dptp_report_summary(r);
	fprintf(f, " \"summary\": {\"pass\": %d, \"fail\": %d, \"skip\": %d, \"error\": %d, \"timeout\": %d}}\n",
		s.pass, s.fail, s.skip, s.error, s.timeout);
	return finish(f);
}

/* ---- JUnit XML ------------------------------------------------------ */

/* First line of a detail, for the message attribute. */
static size_t first_line(const char *s)
{
	size_t n = strcspn(s, "\n");
	return n > 200 ? 200 : n;
}

int dptp_report_write_junit(const struct dptp_report *r, FILE *f)
{
	const char *tool = r->tool ? r->tool : "dptp-check";
	struct dptp_summary all = dptp_report_summary(r);
	double total = 0;
	for (size_t i = 0; i < r->nreplicas; i++)
		for (size_t j = 0; j < r->replicas[i].nchecks; j++)
			total += finite_or_zero(r->replicas[i].checks[j].seconds);

	fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites", f);
	xml_attr(f, "name", tool);
	fprintf(f, " tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.6f\">\n",
		all.pass + all.fail + all.skip + all.error + all.timeout,
		all.fail, all.error + all.timeout, all.skip, total);

	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		int fail = 0, err = 0, skip = 0;
		double t = 0;
		for (size_t j = 0; j < rep->nchecks; j++) {
			switch (sane(rep->checks[j].status)) {
			case DPTP_FAIL: fail++; break;
			case DPTP_ERROR:
			case DPTP_TIMEOUT: err++; break;
			case DPTP_SKIP: skip++; break;
			case DPTP_PASS: break;
			}
			t += finite_or_zero(rep->checks[j].seconds);
		}
		char suite[32];
		snprintf(suite, sizeof(suite), "dp%d", rep->dp);
		fprintf(f, "  <testsuite name=\"%s\" tests=\"%zu\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.6f\">\n",
			suite, rep->nchecks, fail, err, skip, t);

		fputs("    <properties>\n", f);
		fputs("      <property name=\"ranks\" value=\"", f);
		write_ranks(f, rep->ranks, rep->nranks);
		fputs("\"/>\n", f);
		fprintf(f, "      <property name=\"layout\" value=\"world=%d dp=%d pp=%d tp=%d\"/>\n",
			r->world, r->dp, r->pp, r->tp);
		fputs("      <property name=\"backend\"", f);
		xml_attr(f, "value", r->backend);
		fputs("/>\n      <property name=\"bootstrap\"", f);
		xml_attr(f, "value", r->bootstrap);
		fputs("/>\n", f);
		if (r->engine) {
			fputs("      <property name=\"engine\"", f);
			xml_attr(f, "value", r->engine);
			fputs("/>\n", f);
		}
		fprintf(f, "      <property name=\"seed\" value=\"%" PRIu64 "\"/>\n", r->seed);
		fputs("      <property name=\"inject\" value=\"", f);
		for (size_t k = 0; k < r->ninject; k++) {
			if (k)
				fputc(',', f);
			xml_escape(f, or_empty(r->inject[k]), strlen(or_empty(r->inject[k])), true);
		}
		fputs("\"/>\n    </properties>\n", f);

		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			const char *detail = or_empty(c->detail);
			size_t dlen = strlen(detail);
			fputs("    <testcase classname=\"", f);
			xml_escape(f, tool, strlen(tool), true);
			fprintf(f, ".%s\" name=\"%s/", suite, suite);
			xml_escape(f, c->name, name_len(c), true);
			fprintf(f, "\" time=\"%.6f\"", finite_or_zero(c->seconds));
			enum dptp_status st = sane(c->status);
			if (st == DPTP_PASS && !dlen) {
				fputs("/>\n", f);
				continue;
			}
			fputs(">\n", f);
			const char *elem = NULL, *type = dptp_status_name(st);
			switch (st) {
			case DPTP_FAIL: elem = "failure"; break;
			case DPTP_ERROR:
			case DPTP_TIMEOUT: elem = "error"; break;
			case DPTP_SKIP: elem = "skipped"; break;
			case DPTP_PASS: break;
			}
			if (elem) {
				fprintf(f, "      <%s", elem);
				if (st != DPTP_SKIP)
					fprintf(f, " type=\"%s\"", type);
				fputs(" message=\"", f);
				if (dlen)
					xml_escape(f, detail, first_line(detail), true);
				else
					fputs(type, f);
				fputs("\"", f);
				if (st == DPTP_SKIP || !dlen) {
					fputs("/>\n", f);
				} else {
					fputc('>', f);
					dptp_xml_escape(f, detail, dlen);
					fprintf(f, "</%s>\n", elem);
				}
			}
			if (dlen && (st == DPTP_PASS || (st == DPTP_SKIP && first_line(detail) < dlen))) {
				fputs("      <system-out>", f);
				dptp_xml_escape(f, detail, dlen);
				fputs("</system-out>\n", f);
			}
			fputs("    </testcase>\n", f);
		}
		fputs("  </testsuite>\n", f);
	}
	fputs("</testsuites>\n", f);
	return finish(f);
}

/* ---- text ----------------------------------------------------------- */

static const char *status_color(enum dptp_status s)
{
	switch (s) {
	case DPTP_PASS: return "\033[32m";
	case DPTP_SKIP: return "\033[33m";
	case DPTP_FAIL: return "\033[1;31m";
	case DPTP_ERROR: return "\033[1;35m";
	case DPTP_TIMEOUT: return "\033[1;31m";
	}
	return "";
}

/* Upper-case status word padded to width, colored when asked. */
static void put_status(FILE *f, enum dptp_status s, bool color, int width)
{
	char word[16];
	const char *name = dptp_status_name(s);
	size_t i;
	for (i = 0; name[i] && i + 1 < sizeof(word); i++)
		word[i] = (char)(name[i] - 'a' + 'A');
	word[i] = 0;
	if (color)
		fprintf(f, "%s%s\033[0m", status_color(s), word);
	else
		fputs(word, f);
	for (int k = (int)i; k < width; k++)
		fputc(' ', f);
}

/* Writes n bytes for a terminal: valid UTF-8 as is, control bytes and
 * invalid bytes as \xNN, so a detail cannot drive the terminal; each
 * newline is followed by indent. */
static void text_bytes(FILE *f, const char *str, size_t n, const char *indent)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;
	while (i < n) {
		uint32_t cp;
		size_t len = utf8_next(s + i, n - i, &cp);
		if (len == 1 && cp == '\n') {
			fputc('\n', f);
			fputs(indent, f);
		} else if (len == 0 || cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0)) {
			if (len == 0)
				len = 1;
			for (size_t k = 0; k < len; k++)
				fprintf(f, "\\x%02x", s[i + k]);
		} else {
			fwrite(s + i, 1, len, f);
		}
		i += len;
	}
}

int dptp_report_write_text(const struct dptp_report *r, FILE *f, bool color, int verbose)
{
	fprintf(f, "%s %s: world %d = dp %d x pp %d x tp %d, backend %s, bootstrap %s",
		r->tool ? r->tool : "dptp-check", r->version ? r->version : DPTP_VERSION,
		r->world, r->dp, r->pp, r->tp, r->backend ? r->backend : "?",
		r->bootstrap ? r->bootstrap : "?");
	if (r->engine)
		fprintf(f, " (%s)", r->engine);
	fprintf(f, ", seed %" PRIu64 "\n", r->seed);
	if (r->ninject) {
		fputs("inject:", f);
		for (size_t i = 0; i < r->ninject; i++)
			fprintf(f, "%s%s", i ? ", " : " ", or_empty(r->inject[i]));
		fputc('\n', f);
	}

	int namew = 5;
	for (size_t i = 0; i < r->nreplicas; i++)
		for (size_t j = 0; j < r->replicas[i].nchecks; j++) {
			int n = (int)name_len(&r->replicas[i].checks[j]);
			if (n > namew)
				namew = n;
		}

	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		fprintf(f, "\nDP replica %d (rank%s ", rep->dp, rep->nranks == 1 ? "" : "s");
		write_ranks(f, rep->ranks, rep->nranks);
		fputs("): ", f);
		put_status(f, rep->status, color, 0);
		fputc('\n', f);
		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			const char *d = or_empty(c->detail);
			size_t dlen = strlen(d);
			fputs("  ", f);
			text_bytes(f, c->name, name_len(c), "");
			fprintf(f, "%*s  ", namew - (int)name_len(c), "");
			put_status(f, c->status, color, 7);
			fprintf(f, " %9.4fs", finite_or_zero(c->seconds));
			if (dlen) {
				fputs("  ", f);
				if (verbose > 0) {
					text_bytes(f, d, dlen, "      ");
				} else {
					size_t n = first_line(d);
					text_bytes(f, d, n, "");
					if (n < dlen)
						fputs(" ...", f);
				}
			}
			fputc('\n', f);
		}
	}

	bool tp1 = r->nbench > 0;
	for (size_t i = 0; i < r->nbench; i++)
		tp1 &= r->bench[i].tp == 1;
	if (tp1) {
		fprintf(f, "\nbench at TP 1: there is no allreduce to fuse. fused_us is the residual + RMSNorm "
			   "kernel alone, unfused_us NCCL's one-rank allreduce + the same kernel; no speedup\n");
	} else if (r->nbench > 0) {
		fprintf(f, "\nbench: fused vs unfused allreduce + residual + RMSNorm\n");
	}
	if (r->nbench > 0) {
		fprintf(f, "  %4s %7s %7s %5s %12s %12s %8s %12s %12s\n", "tp", "tokens", "hidden",
			"dtype", "fused_us", "unfused_us", "speedup", "fused_GB/s", "unfused_GB/s");
		for (size_t i = 0; i < r->nbench; i++) {
			const struct dptp_bench_row *b = &r->bench[i];
			fputs("  ", f);
			fprintf(f, "%4d %7d %7d ", b->tp, b->tokens, b->hidden);
			size_t dl = strnlen(b->dtype, sizeof(b->dtype));
			text_bytes(f, b->dtype, dl, "");
			fprintf(f, "%*s %12.2f %12.2f ", 5 - (int)dl, "", b->fused_us, b->unfused_us);
			if (b->tp > 1)
				fprintf(f, "%7.2fx", b->speedup);
			else
				fprintf(f, "%8s", "-");
			fprintf(f, " %12.2f %12.2f\n", b->fused_busbw_gbs, b->unfused_busbw_gbs);
		}
	}

	/* a --bench report has no replicas: no summary of none */
	if (r->nreplicas > 0 || r->nbench == 0) {
		struct dptp_summary s = dptp_report_summary(r);
		fprintf(f, "\nsummary: %d pass, %d fail, %d skip, %d error, %d timeout over %zu replica%s: ",
			s.pass, s.fail, s.skip, s.error, s.timeout, r->nreplicas,
			r->nreplicas == 1 ? "" : "s");
		put_status(f, dptp_report_worst(r), color, 0);
		fputc('\n', f);
	}
	return finish(f);
}

int dptp_report_write(const struct dptp_report *r, enum dptp_format fmt, FILE *f,
		      bool color, int verbose)
{
	switch (fmt) {
	case DPTP_FORMAT_TEXT: return dptp_report_write_text(r, f, color, verbose);
	case DPTP_FORMAT_JSON: return dptp_report_write_json(r, f);
	case DPTP_FORMAT_JUNIT: return dptp_report_write_junit(r, f);
	}
	return -EINVAL;
}

/* ---- atomic file ---------------------------------------------------- */

/* The mode a new file would get: 0666 less the umask, read without
 * changing it (umask(2) would race with other threads). */
static mode_t new_file_mode(void)
{
	mode_t mask = 022;
	FILE *st = fopen("/proc/self/status", "re");
	if (st) {
		char line[256];
		while (fgets(line, sizeof(line), st)) {
			unsigned m;
			if (sscanf(line, "Umask: %o", &m) == 1) {
				mask = (mode_t)m;
				break;
			}
		}
		fclose(st);
	}
	return 0666 & ~mask;
}

/* A target written in place, not replaced: an existing file that is not a
 * regular one (character device, FIFO, socket), or a descriptor named by
 * path (/dev/fd/N, /proc/self/fd/N, /dev/stdout, /dev/stderr). */
static bool in_place(const char *path)
{
	static const char *const fdpaths[] = { "/dev/fd/", "/proc/self/fd/", "/dev/stdout", "/dev/stderr" };
	for (size_t i = 0; i < sizeof(fdpaths) / sizeof(fdpaths[0]); i++)
		if (strncmp(path, fdpaths[i], strlen(fdpaths[i])) == 0)
			return true;
	struct stat st;
	return stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

/* Opens an in-place target for writing; a FIFO without a reader is waited
 * for at most 10 s (opened non-blocking, then made blocking to write). */
static int open_in_place(const char *path, struct dptp_err *err)
{
	double end = dptp_now() + 10;
	for (;;) {
		int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd >= 0) {
			struct stat st;
			if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0) {
				int e = errno;
				close(fd);
				return dptp_err_set(err, -e, "cannot write report '%s': truncate: %s", path, strerror(e));
			}
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
			return fd;
		}
		if (errno != ENXIO || dptp_now() > end)
			return dptp_err_set(err, -errno, "cannot write report '%s': %s%s", path, strerror(errno),
					    errno == ENXIO ? " (a FIFO nobody read for 10 s)" : "");
		struct timespec ts = { 0, 20000000 };
		nanosleep(&ts, NULL);
	}
}

static int write_in_place(int (*emit)(void *arg, FILE *f), void *arg, const char *path,
			  struct dptp_err *err)
{
	int fd = open_in_place(path, err);
	if (fd < 0)
		return fd;
	FILE *f = fdopen(fd, "w");
	if (!f) {
		int e = errno;
		close(fd);
		return dptp_err_set(err, -e, "cannot write report '%s': %s", path, strerror(e));
	}
	errno = 0;
	int rc = emit(arg, f);
	if (rc == -EINVAL) {
		fclose(f);
		return dptp_err_set(err, rc, "cannot write report '%s': unknown format", path);
	}
	if (rc < 0 || fflush(f) != 0 || ferror(f))
		rc = -(errno ? errno : EIO);
	if (fclose(f) != 0 && rc == 0)
		rc = -errno;
	return rc < 0 ? dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc)) : 0;
}

struct report_emit {
	const struct dptp_report *r;
	enum dptp_format fmt;
};

static int emit_report(void *arg, FILE *f)
{
	const struct report_emit *e = arg;
	return dptp_report_write(e->r, e->fmt, f, false, 0);
}

int dptp_report_write_file(const struct dptp_report *r, enum dptp_format fmt,
			   const char *path, struct dptp_err *err)
{
	struct report_emit e = { r, fmt };
	return dptp_write_file_with(path, emit_report, &e, err);
}

int dptp_write_file_with(const char *path, int (*emit)(void *arg, FILE *f), void *arg,
			 struct dptp_err *err)
{
	if (!path || !*path)
		return dptp_err_set(err, -EINVAL, "cannot write the report: empty file name");
	if (in_place(path))
		return write_in_place(emit, arg, path, err);
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	if (!*base)
		return dptp_err_set(err, -EISDIR, "cannot write report '%s': names a directory", path);
	size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	/* the temporary sibling is ".<name>.tmpXXXXXX", or a fixed short name
	 * when that would pass NAME_MAX */
	if (strlen(base) + sizeof("..tmpXXXXXX") > NAME_MAX)
		base = "dptp-report";
	size_t tlen = dirlen + 1 + strlen(base) + sizeof(".tmpXXXXXX");
	char *tmp = malloc(tlen);
	if (!tmp)
		return dptp_err_set(err, -ENOMEM, "cannot write report '%s': out of memory", path);
	snprintf(tmp, tlen, "%.*s.%s.tmpXXXXXX", (int)dirlen, path, base);

	int rc = 0;
	FILE *f = NULL;
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot create a temporary file for report '%s': %s",
			     path, strerror(-rc));
		free(tmp);
		return rc;
	}
	struct stat old;
	mode_t mode = stat(path, &old) == 0 ? (old.st_mode & 07777) : new_file_mode();
	if (fchmod(fd, mode) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': chmod: %s", path, strerror(-rc));
		close(fd);
		goto fail;
	}
	f = fdopen(fd, "w");
	if (!f) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		close(fd);
		goto fail;
	}
	errno = 0;
	rc = emit(arg, f);
	if (rc == -EINVAL) {
		dptp_err_set(err, rc, "cannot write report '%s': unknown format", path);
		fclose(f);
		goto fail;
	}
	if (rc < 0 || fflush(f) != 0 || ferror(f)) {
		rc = -(errno ? errno : EIO);
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		fclose(f);
		goto fail;
	}
	if (fsync(fileno(f)) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': fsync: %s", path, strerror(-rc));
		fclose(f);
		goto fail;
	}
	if (fclose(f) != 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		goto fail;
	}
	if (rename(tmp, path) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': rename: %s", path, strerror(-rc));
		goto fail;
	}
	/* Make the rename itself durable; a failure here loses nothing. */
	char *dir = strndup(path, dirlen ? dirlen : 0);
	int dfd = open(dirlen ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	free(dir);
	free(tmp);
	return 0;
fail:
	unlink(tmp);
	free(tmp);
	return rc;
}

void dptp_report_release(struct dptp_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; r->replicas && i < r->nreplicas; i++) {
		struct dptp_replica_result *rep = &r->replicas[i];
		for (size_t j = 0; rep->checks && j < rep->nchecks; j++)
			free(rep->checks[j].detail);
		free(rep->checks);
		free(rep->ranks);
	}
	free(r->replicas);
	r->replicas = NULL;
	r->nreplicas = 0;
}
