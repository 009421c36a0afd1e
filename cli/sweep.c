/* dptp-check --layouts: the checks over several (dp, pp, tp) layouts of one
 * job, regrouping without a relaunch, and the layout x replica matrix that
 * says where a fault is visible. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks/check.h"
#include "dptp-config.h"
#include "report/gather.h"
#include "report/report.h"
#include "options.h"
#include "stop.h"
#include "sweep.h"

struct sweep {
	int n;                          /* layouts */
	int lay[DPTP_MAX_LAYOUTS][3];   /* dp, pp, tp */
	size_t nsel;                    /* checks per layout */
	struct dptp_report *reps;       /* [n], rank 0 */
	const char *inject[DPTP_NFAULTS];
	size_t ninject;
};

static void layout_name(const int *l, char *buf, size_t n)
{
	snprintf(buf, n, "%dx%dx%d", l[0], l[1], l[2]);
}

static bool failed(enum dptp_status s)
{
	return s >= DPTP_FAIL;
}

/* Replica d of layout i: its failing checks, comma-joined, or "." */
static void cell(const struct sweep *w, int i, int d, char *buf, size_t n)
{
	const struct dptp_report *r = &w->reps[i];
	size_t off = 0;
	buf[0] = 0;
	if ((size_t)d >= r->nreplicas) {
		snprintf(buf, n, "%s", "");
		return;
	}
	const struct dptp_replica_result *rr = &r->replicas[d];
	for (size_t k = 0; k < rr->nchecks && off < n; k++)
		if (failed(rr->checks[k].status))
			off += (size_t)snprintf(buf + off, n - off, "%s%s%s", off ? "," : "", rr->checks[k].name,
						rr->checks[k].status == DPTP_FAIL ? "" : "!");
	if (!off)
		snprintf(buf, n, ".");
}

static bool layout_fails(const struct sweep *w, int i, int only_replica)
{
	const struct dptp_report *r = &w->reps[i];
	for (size_t d = 0; d < r->nreplicas; d++)
		for (size_t k = 0; k < r->replicas[d].nchecks; k++)
			if ((only_replica < 0 || (int)d == only_replica) && failed(r->replicas[d].checks[k].status))
				return true;
	return false;
}

/* "visible only with dp > 1 and tp > 1 (3 of 6 layouts: ...); replica 0
 * always healthy": derived from the matrix alone. */
static void visible_sentence(const struct sweep *w, char *buf, size_t n)
{
	static const char *const dim[3] = { "dp", "pp", "tp" };
	int nf = 0;
	bool always_gt1[3] = { true, true, true };
	char list[512] = "";
	size_t lo = 0;
	for (int i = 0; i < w->n; i++) {
		if (!layout_fails(w, i, -1))
			continue;
		nf++;
		for (int k = 0; k < 3; k++)
			always_gt1[k] &= w->lay[i][k] > 1;
		char ln[32];
		layout_name(w->lay[i], ln, sizeof(ln));
		if (lo < sizeof(list))
			lo += (size_t)snprintf(list + lo, sizeof(list) - lo, "%s%s", lo ? ", " : "", ln);
	}
	if (nf == 0) {
		snprintf(buf, n, "no check failed in any of the %d layouts", w->n);
		return;
	}
	size_t off = 0;
	if (nf == w->n) {
		off += (size_t)snprintf(buf, n, "visible in every layout (%d)", w->n);
	} else {
		char conds[64] = "";
		size_t co = 0;
		for (int k = 0; k < 3; k++)
			if (always_gt1[k])
				co += (size_t)snprintf(conds + co, sizeof(conds) - co, "%s%s > 1", co ? " and " : "",
						       dim[k]);
		off += (size_t)snprintf(buf, n, "visible %s%s%sin %d of %d layouts (%s)", co ? "only with " : "", conds,
					co ? " " : "", nf, w->n, list);
	}
	bool r0 = false;
	for (int i = 0; i < w->n; i++)
		r0 |= layout_fails(w, i, 0);
	if (!r0 && off < n)
		snprintf(buf + off, n - off, "; replica 0 always healthy");
}

static void write_matrix_text(const struct sweep *w, FILE *f)
{
	int maxdp = 0;
	for (int i = 0; i < w->n; i++)
		maxdp = w->lay[i][0] > maxdp ? w->lay[i][0] : maxdp;
	int width = 8;
	char c[512];
	for (int i = 0; i < w->n; i++)
		for (int d = 0; d < w->lay[i][0]; d++) {
			cell(w, i, d, c, sizeof(c));
			width = (int)strlen(c) > width ? (int)strlen(c) : width;
		}
	fprintf(f, "\nlayout matrix (DPxPPxTP down, replicas across; a cell lists the failing checks, "
		"'!' error or timeout, '.' none):\n%-10s", "layout");
	for (int d = 0; d < maxdp; d++) {
		char h[16];
		snprintf(h, sizeof(h), "dp%d", d);
		fprintf(f, " %-*s", d + 1 < maxdp ? width : 0, h);
	}
	fputc('\n', f);
	for (int i = 0; i < w->n; i++) {
		char ln[32];
		layout_name(w->lay[i], ln, sizeof(ln));
		fprintf(f, "%-10s", ln);
		for (int d = 0; d < w->lay[i][0]; d++) {
			cell(w, i, d, c, sizeof(c));
			fprintf(f, " %-*s", d + 1 < w->lay[i][0] ? width : 0, c);
		}
		fputc('\n', f);
	}
	char v[1024];
	visible_sentence(w, v, sizeof(v));
	fprintf(f, "%s\n", v);
}

static void write_text(const struct sweep *w, FILE *f, bool color, int verbose)
{
	for (int i = 0; i < w->n; i++) {
		char ln[32];
		layout_name(w->lay[i], ln, sizeof(ln));
		fprintf(f, "%s== layout %s (dp %d x pp %d x tp %d)\n", i ? "\n" : "", ln, w->lay[i][0], w->lay[i][1],
			w->lay[i][2]);
		dptp_report_write_text(&w->reps[i], f, color, verbose);
	}
	write_matrix_text(w, f);
}

static void write_json(const struct sweep *w, FILE *f)
{
	fprintf(f, "{\"tool\": \"dptp-check\", \"version\": \"%s\", \"world\": %d,\n \"layouts\": [\n", DPTP_VERSION,
		w->reps[0].world);
	for (int i = 0; i < w->n; i++) {
		if (i)
			fputs(",\n", f);
		dptp_report_write_json(&w->reps[i], f);
	}
	fputs("],\n \"matrix\": [", f);
	for (int i = 0; i < w->n; i++) {
		char ln[32];
		layout_name(w->lay[i], ln, sizeof(ln));
		fprintf(f, "%s\n  {\"layout\": \"%s\", \"dp\": %d, \"pp\": %d, \"tp\": %d, \"replicas\": [", i ? "," : "",
			ln, w->lay[i][0], w->lay[i][1], w->lay[i][2]);
		const struct dptp_report *r = &w->reps[i];
		for (size_t d = 0; d < r->nreplicas; d++) {
			fprintf(f, "%s{\"dp\": %zu, \"failing\": [", d ? ", " : "", d);
			int m = 0;
			for (size_t k = 0; k < r->replicas[d].nchecks; k++)
				if (failed(r->replicas[d].checks[k].status))
					fprintf(f, "%s\"%s\"", m++ ? ", " : "", r->replicas[d].checks[k].name);
			fputs("]}", f);
		}
		fputs("]}", f);
	}
	char v[1024];
	visible_sentence(w, v, sizeof(v));
	fputs("\n ],\n \"visible\": \"", f);
	dptp_json_escape(f, v, strlen(v));
	fputs("\"}\n", f);
}

static void write_junit(const struct sweep *w, FILE *f)
{
	fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"dptp-check --layouts\">\n", f);
	for (int i = 0; i < w->n; i++) {
		char ln[32];
		layout_name(w->lay[i], ln, sizeof(ln));
		const struct dptp_report *r = &w->reps[i];
		for (size_t d = 0; d < r->nreplicas; d++) {
			const struct dptp_replica_result *rr = &r->replicas[d];
			fprintf(f, "  <testsuite name=\"%s/dp%zu\" tests=\"%zu\">\n", ln, d, rr->nchecks);
			for (size_t k = 0; k < rr->nchecks; k++) {
				const struct dptp_check_result *c = &rr->checks[k];
				fprintf(f, "    <testcase classname=\"%s\" name=\"%s/dp%zu/%s\" time=\"%.6f\"", ln, ln, d, c->name,
					c->seconds);
				const char *tag = c->status == DPTP_FAIL ? "failure" : c->status >= DPTP_ERROR ? "error"
						 : c->status == DPTP_SKIP ? "skipped" : NULL;
				if (!tag) {
					fputs("/>\n", f);
					continue;
				}
				fprintf(f, ">\n      <%s message=\"", tag);
				dptp_xml_escape(f, c->detail ? c->detail : "", c->detail ? strlen(c->detail) : 0);
				fprintf(f, "\"/>\n    </testcase>\n");
			}
			fputs("  </testsuite>\n", f);
		}
	}
	fputs("</testsuites>\n", f);
}

static void write_any(const struct sweep *w, enum dptp_format fmt, FILE *f, bool color, int verbose)
{
	if (fmt == DPTP_FORMAT_JSON)
		write_json(w, f);
	else if (fmt == DPTP_FORMAT_JUNIT)
		write_junit(w, f);
	else
		write_text(w, f, color, verbose);
}

struct sweep_emit {
	const struct sweep *w;
	enum dptp_format fmt;
};

static int emit_sweep(void *arg, FILE *f)
{
	const struct sweep_emit *e = arg;
	write_any(e->w, e->fmt, f, false, 0);
	return ferror(f) ? -EIO : 0;
}

/* As --output does for one report: atomic replace, or in place for a
 * device, FIFO or descriptor path (lib/report). */
static int write_file(const struct sweep *w, enum dptp_format fmt, const char *path, struct dptp_err *err)
{
	struct sweep_emit e = { w, fmt };
	return dptp_write_file_with(path, emit_sweep, &e, err);
}

/* Rank 0: the reports to --output (and the text on stdout with JSON or
 * JUnit there), or to stdout. Returns code, or 3 when the file could not be
 * written. */
static int write_out(const struct sweep *w, const struct dptp_options *o, int code)
{
	struct dptp_err err = {0};
	bool tty = dptp_use_colour(STDOUT_FILENO);
	if (o->output) {
		if (write_file(w, o->format, o->output, &err) < 0) {
			fprintf(stderr, "dptp-check: %s\n", err.msg);
			code = EXIT_ENV;
		}
		if (o->format != DPTP_FORMAT_TEXT)
			write_text(w, stdout, tty, o->verbose);
	} else {
		write_any(w, o->format, stdout, tty && o->format == DPTP_FORMAT_TEXT, o->verbose);
	}
	fflush(stdout);
	return code;
}

/* Rank 0: one report per layout from the results of every rank (gathered
 * as "replicas" of one rank each, details prefixed "rank q: "). */
static int split_reports(struct sweep *w, const struct dptp_report *all, const struct dptp_bootstrap *b,
			 const struct dptp_options *o, const struct dptp_params *p)
{
	int world = b->size;
	/* a gather that ran out of memory leaves rows short or missing */
	if (all->nreplicas != (size_t)world)
		return -ENOMEM;
	for (int q = 0; q < world; q++)
		if (all->replicas[q].nchecks != (size_t)w->n * w->nsel)
			return -ENOMEM;
	struct dptp_check_result **rows = calloc((size_t)world, sizeof(*rows));
	w->reps = calloc((size_t)w->n, sizeof(*w->reps));
	if (!rows || !w->reps) {
		free(rows);
		return -ENOMEM;
	}
	for (int q = 0; q < world; q++)
		rows[q] = calloc(w->nsel ? w->nsel : 1, sizeof(**rows));
	int rc = 0;
	for (int i = 0; rc == 0 && i < w->n; i++) {
		for (int q = 0; q < world; q++) {
			if (!rows[q]) {
				rc = -ENOMEM;
				break;
			}
			char pre[32];
			int pl = snprintf(pre, sizeof(pre), "rank %d: ", q);
			for (size_t k = 0; k < w->nsel; k++) {
				const struct dptp_check_result *src = &all->replicas[q].checks[(size_t)i * w->nsel + k];
				rows[q][k] = *src;
				if (src->detail && strncmp(src->detail, pre, (size_t)pl) == 0)
					rows[q][k].detail = src->detail + pl;
			}
		}
		struct dptp_layout l = { .world = world, .dp = w->lay[i][0], .pp = w->lay[i][1], .tp = w->lay[i][2] };
		struct dptp_report *r = &w->reps[i];
		*r = (struct dptp_report){
			.tool = "dptp-check", .version = DPTP_VERSION, .world = world,
			.dp = l.dp, .pp = l.pp, .tp = l.tp, .backend = all->backend, .bootstrap = b->ops->name,
			.engine = b->engine, .seed = o->seed, .ninject = w->ninject, .inject = w->inject,
		};
		if (rc == 0 && dptp_results_merge(&l, rows, w->nsel, r) < 0)
			rc = -ENOMEM;
		dptp_cli_fill_mech(r);
	}
	for (int q = 0; q < world; q++)
		free(rows[q]);
	free(rows);
	(void)p;
	return rc;
}

/* What a signal's report needs of the sweep (rank 0's results so far). */
struct last_words {
	struct sweep *w;
	const struct dptp_options *o;
	const struct dptp_bootstrap *b;
	const struct dptp_check_result *res;
	const char *backend;
};

/* A signal ended the sweep: every layout's report, rank 0's finished
 * results in them, the rest not run (stop.h). */
static int sweep_last_words(void *arg, int sig, const char *when, size_t ndone, bool running)
{
	struct last_words *lw = arg;
	struct sweep *w = lw->w;
	size_t cur = w->nsel ? ndone / w->nsel : 0;
	char at[192];
	if (cur < (size_t)w->n)
		snprintf(at, sizeof(at), "%s (layout %dx%dx%d)", when, w->lay[cur][0], w->lay[cur][1], w->lay[cur][2]);
	else
		snprintf(at, sizeof(at), "%s", when);
	w->reps = calloc((size_t)w->n, sizeof(*w->reps));
	int rc = w->reps ? 0 : -ENOMEM;
	for (int i = 0; rc == 0 && i < w->n; i++) {
		size_t base = (size_t)i * w->nsel;
		size_t nd = ndone > base ? ndone - base : 0;
		w->reps[i] = (struct dptp_report){
			.tool = "dptp-check", .version = DPTP_VERSION, .backend = lw->backend,
			.bootstrap = lw->b->ops->name, .engine = lw->b->engine, .seed = lw->o->seed,
			.ninject = w->ninject, .inject = w->inject,
		};
		rc = dptp_stop_fill_layout(&w->reps[i], lw->o, lw->b->size, w->lay[i], sig, at, lw->res + base,
					   nd < w->nsel ? nd : w->nsel, running && (size_t)i == cur);
	}
	if (rc < 0) {
		fprintf(stderr, "dptp-check: out of memory writing the report\n");
		return EXIT_ENV;
	}
	return write_out(w, lw->o, EXIT_ENV);
}

/* The selected checks' results of a layout that did not run. */
static void not_run(const struct dptp_options *o, struct dptp_check_result *r, enum dptp_status s, const char *why)
{
	size_t m = 0;
	for (int k = 0; k < dptp_nchecks; k++)
		if ((o->checks >> k) & 1u) {
			snprintf(r[m].name, sizeof(r[m].name), "%s", dptp_checks[k]->name);
			dptp_result_set(&r[m++], s, "%s", why);
		}
}

int dptp_check_sweep(const struct dptp_options *o, struct dptp_bootstrap *b, const struct dptp_params *p0)
{
	struct dptp_err err = {0};
	struct sweep w = {0};
	if (dptp_layouts_parse(o->layouts, b->size, w.lay, DPTP_MAX_LAYOUTS, &w.n, &err) < 0 || w.n == 0) {
		const char *msg = w.n == 0 && !err.msg[0] ? "--layouts: no layout" : err.msg;
		if (b->rank == 0)
			fprintf(stderr, "dptp-check: %s\n", msg);
		if (b->rank == 0 && o->output && dptp_stop_claim()) {
			char why[DPTP_ERR_MAX + 32];
			snprintf(why, sizeof(why), "not run: usage: %s", msg);
			(void)dptp_stop_report_not_run(o, b, b->size, p0->cuda, DPTP_ERROR, why, EXIT_USAGE, NULL, 0);
		}
		dptp_stop_done(EXIT_USAGE);
		dptp_cli_share_verdict(b, EXIT_USAGE, false, 5);
		dptp_bootstrap_destroy(b);
		return EXIT_USAGE;
	}
	for (int i = 0; i < dptp_nchecks; i++)
		w.nsel += (o->checks >> i) & 1u;
	for (int f = 0; f < DPTP_NFAULTS; f++)
		if (dptp_fault_on(o->inject, f))
			w.inject[w.ninject++] = dptp_faults[f].name;
	struct dptp_check_result *res = calloc((size_t)w.n * (w.nsel ? w.nsel : 1), sizeof(*res));
	if (!res) {
		fprintf(stderr, "dptp-check: rank %d: out of memory\n", b->rank);
		dptp_bootstrap_destroy(b);
		return EXIT_ENV;
	}
	struct dptp_params p = *p0;
	bool broken = false;
	int code = EXIT_PASS;
	struct last_words lw = { &w, o, b, res, p.cuda ? "cuda" : "host" };
	dptp_stop_sweep(sweep_last_words, &lw);
	for (int i = 0; i < w.n; i++) {
		struct dptp_check_result *r = &res[(size_t)i * w.nsel];
		dptp_stop_sweep_at((size_t)i * w.nsel);
		if (broken) {
			/* lockstep was lost: the later layouts are not run */
			not_run(o, r, DPTP_SKIP, "not run: an earlier layout timed out or could not be built");
			continue;
		}
		p.dp = w.lay[i][0];
		p.pp = w.lay[i][1];
		p.tp = w.lay[i][2];
		struct dptp_ctx c;
		int rc = dptp_ctx_init(&c, b, &p, &err);
		if (rc < 0) {
			fprintf(stderr, "dptp-check: rank %d: layout %dx%dx%d: %s\n", b->rank, p.dp, p.pp, p.tp, err.msg);
			dptp_ctx_release(&c);
			code = rc == -ETIMEDOUT ? EXIT_TIMEOUT : EXIT_ENV;
			broken = true;
			char why[DPTP_ERR_MAX + 32];
			snprintf(why, sizeof(why), "layout not built: %s", err.msg);
			not_run(o, r, rc == -ETIMEDOUT ? DPTP_TIMEOUT : DPTP_ERROR, why);
			continue;
		}
		dptp_cli_run_checks(o, &c, r);
		p.xseq = c.x.seq; /* the next context continues with fresh keys */
		broken = c.x.broken;
		dptp_ctx_release(&c);
	}
	/* one gather: each rank's results of every layout, as a "replica" of one rank */
	struct dptp_layout single = { .world = b->size, .dp = b->size, .pp = 1, .tp = 1 };
	struct dptp_report all = { .backend = p.cuda ? "cuda" : "host" };
	double gather_timeout = broken ? 0.3 : o->timeout;
	dptp_stop_sweep_at((size_t)w.n * w.nsel);
	dptp_stop_gather();
	int grc = dptp_gather_results(b, &single, res, (size_t)w.n * w.nsel, gather_timeout, &all, &err);
	if (grc < 0)
		fprintf(stderr, "dptp-check: rank %d: gathering the results: %s\n", b->rank, err.msg);
	if (b->rank == 0 && dptp_stop_claim()) {
		if (split_reports(&w, &all, b, o, &p) < 0) {
			fprintf(stderr, "dptp-check: out of memory writing the report\n");
			code = EXIT_ENV;
		} else {
			enum dptp_status worst = DPTP_PASS;
			for (int i = 0; i < w.n; i++)
				worst = dptp_status_worst(worst, dptp_report_worst(&w.reps[i]));
			/* a report that could not be built whole is no verdict on what it lacks */
			if (grc < 0 && grc != -ETIMEDOUT && grc != -EPROTO)
				worst = dptp_status_worst(worst, DPTP_ERROR);
			int rcode = worst == DPTP_FAIL ? EXIT_FAIL : worst == DPTP_TIMEOUT ? EXIT_TIMEOUT
				    : worst == DPTP_ERROR ? EXIT_ENV : EXIT_PASS;
			if (code == EXIT_PASS || rcode == EXIT_TIMEOUT)
				code = rcode;
			code = write_out(&w, o, code);
		}
		dptp_stop_done(code);
	}
	code = dptp_cli_share_verdict(b, code, broken, gather_timeout + (broken ? 1.0 : 5.0));
	dptp_stop_done(code);
	for (size_t k = 0; k < (size_t)w.n * w.nsel; k++)
		free(res[k].detail);
	free(res);
	for (int i = 0; w.reps && i < w.n; i++)
		dptp_report_release(&w.reps[i]);
	free(w.reps);
	dptp_report_release(&all);
	if (broken)
		_exit(code); /* a fence may still be pending in PMIx: don't wait for it */
	dptp_bootstrap_destroy(b);
	return code;
}
