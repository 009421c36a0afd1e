/* dptp-check: option parsing, orchestration, exit codes. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "checks/check.h"
#include "checks/ctx.h"
#include "plane/device.h"
#include "dptp-config.h"
#include "report/gather.h"
#include "bench.h"
#include "options.h"
#include "stop.h"
#include "sweep.h"
#include "report/report.h"

int dptp_check_main(int argc, char **argv);


static void print_list(void)
{
	printf("Checks:\n");
	for (int i = 0; i < dptp_nchecks; i++)
		printf("  %-16s %s\n", dptp_checks[i]->name, dptp_checks[i]->summary);
	printf("\nFaults (--inject; mechanisms of the bug family: G group, R rank kind, I identifier,\n"
	       "C coordinate, D device, P participation):\n");
	for (int i = 0; i < DPTP_NFAULTS; i++) {
		const struct dptp_fault_desc *f = &dptp_faults[i];
		printf("  %-18s mechanism %s, caught by %s: %s\n", f->name, f->mech, f->check, f->summary);
		printf("  %-18s real bugs: %s\n", "", f->bugs);
		printf("  %-18s real symptom: %s\n", "", f->symptom);
	}
}

/* A test hook: stop this rank (SIGSTOP) before a named check, so tests can
 * prove that a peer that never answers becomes `timeout`, not a hang. */
static void maybe_stall(const struct dptp_ctx *c, const char *check)
{
	const char *r = getenv("DPTP_TEST_STALL_RANK"), *k = getenv("DPTP_TEST_STALL_CHECK");
	uint64_t want;
	if (r && dptp_parse_u64(r, 0, INT32_MAX, false, &want) == 0 && want == (uint64_t)c->rank &&
	    (!k || strcmp(k, check) == 0))
		raise(SIGSTOP);
}

/* A test hook: rank 0 creates the file DPTP_TEST_READY_FILE names when it
 * starts waiting for its peers, so tests can end a peer at start-up once
 * rank 0 is surely there (tests/e2e/crashwrap.sh). */
static void test_ready(const struct dptp_bootstrap *b)
{
	const char *f = getenv("DPTP_TEST_READY_FILE");
	int fd;
	if (f && *f && b->rank == 0 && (fd = open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
}

static int status_exit(enum dptp_status s)
{
	switch (s) {
	case DPTP_SKIP:
	case DPTP_PASS: return EXIT_PASS;
	case DPTP_FAIL: return EXIT_FAIL;
	case DPTP_ERROR: return EXIT_ENV;
	case DPTP_TIMEOUT: return EXIT_TIMEOUT;
	}
	return EXIT_ENV;
}

/* Runs the checks selected in o, in lockstep on every rank; returns how
 * many results res[] holds. */
size_t dptp_cli_run_checks(const struct dptp_options *o, struct dptp_ctx *c, struct dptp_check_result *res)
{
	size_t nres = 0;
	for (int i = 0; i < dptp_nchecks; i++) {
		if (!(o->checks & (1u << i)))
			continue;
		struct dptp_check_result *r = &res[nres++];
		bool runs = !c->x.broken;
		dptp_stop_checks(res, nres - 1, dptp_checks[i]->name); /* for a signal's report */
		if (runs)
			maybe_stall(c, dptp_checks[i]->name);
		dptp_check_run(dptp_checks[i], c, o->timeout, r);
		dptp_stop_checks(res, nres, NULL);
		if (runs && (o->verbose || r->status >= DPTP_ERROR))
			fprintf(stderr, "dptp-check: rank %d: %s %s (%.4f s) %s\n", c->rank, r->name,
				dptp_status_name(r->status), r->seconds, r->detail);
	}
	return nres;
}

/* Rank 0 publishes its exit code, the others wait for it up to `wait`
 * seconds (no rank leaves, which makes launchers kill its siblings, before
 * rank 0 has written). Returns the code every rank exits with. */
int dptp_cli_share_verdict(struct dptp_bootstrap *b, int code, bool broken, double wait)
{
	int32_t shared = code;
	if (b->rank == 0) {
		dptp_bootstrap_publish(b, "dptp.verdict", &shared, sizeof(shared), NULL);
		return code;
	}
	void *v = NULL;
	size_t vl = 0;
	if (dptp_fetch_published(b, 0, "dptp.verdict", dptp_now() + wait, &v, &vl, NULL) == 0 &&
	    vl == sizeof(shared))
		memcpy(&shared, v, sizeof(shared));
	else if (broken)
		shared = EXIT_TIMEOUT;
	free(v);
	return shared;
}

int dptp_cli_write_report(const struct dptp_options *o, const struct dptp_report *rep, int code, bool colour)
{
	struct dptp_err err = {0};
	if (o->output) {
		if (dptp_report_write_file(rep, o->format, o->output, &err) < 0) {
			fprintf(stderr, "dptp-check: %s\n", err.msg);
			code = EXIT_ENV;
		}
		if (o->format != DPTP_FORMAT_TEXT)
			dptp_report_write_text(rep, stdout, colour, o->verbose);
	} else {
		dptp_report_write(rep, o->format, stdout, colour && o->format == DPTP_FORMAT_TEXT, o->verbose);
	}
	fflush(stdout);
	return code;
}

/* The mechanism each check tests, named beside a failure in JSON. */
void dptp_cli_fill_mech(struct dptp_report *rep)
{
	for (size_t d = 0; d < rep->nreplicas; d++)
		for (size_t k = 0; k < rep->replicas[d].nchecks; k++) {
			int id = dptp_check_lookup(rep->replicas[d].checks[k].name);
			rep->replicas[d].checks[k].mech = id >= 0 ? dptp_checks[id]->mech : NULL;
		}
}

/* The selected checks' results when the start-up (learning the peers,
 * the data plane) failed on this rank: not run, `timeout` or `error`. */
static size_t startup_results(const struct dptp_options *o, int rc, const struct dptp_err *err,
			      struct dptp_check_result *res)
{
	size_t nres = 0;
	for (int i = 0; i < dptp_nchecks; i++)
		if (o->checks & (1u << i)) {
			struct dptp_check_result *r = &res[nres++];
			snprintf(r->name, sizeof(r->name), "%s", dptp_checks[i]->name);
			dptp_result_set(r, rc == -ETIMEDOUT ? DPTP_TIMEOUT : DPTP_ERROR, "not run: start-up %s: %s",
					rc == -ETIMEDOUT ? "timed out" : "failed", err->msg);
		}
	return nres;
}

/* Rank 0, after a failed start-up: the ranks that never reported, named
 * first in every (replica, check)'s detail (JUnit's message attribute
 * keeps 200 characters). */
static void note_missing(struct dptp_report *rep, const char *why)
{
	for (size_t d = 0; d < rep->nreplicas; d++)
		for (size_t k = 0; k < rep->replicas[d].nchecks; k++) {
			struct dptp_check_result *r = &rep->replicas[d].checks[k];
			char *old = r->detail;
			r->detail = NULL;
			dptp_result_set(r, r->status, "start-up: %s%s%s", why, old && *old ? "; " : "", old ? old : "");
			free(old);
		}
}

/* Gathers every rank's results res[nres] to rank 0, which writes the
 * report (--output, stdout); a rank that lost lockstep (broken) waits only
 * briefly. Returns the exit code, the same on every rank. */
static int report_and_verdict(const struct dptp_options *o, struct dptp_bootstrap *b,
			      const struct dptp_layout *l, bool cuda, const struct dptp_check_result *res,
			      size_t nres, double gather_timeout, bool broken, bool startup)
{
	struct dptp_err err = {0};
	struct dptp_report rep = {
		.tool = "dptp-check", .version = DPTP_VERSION,
		.world = l->world, .dp = l->dp, .pp = l->pp, .tp = l->tp,
		.backend = cuda ? "cuda" : "host", .bootstrap = b->ops->name, .engine = b->engine, .seed = o->seed,
	};
	const char *inject[DPTP_NFAULTS];
	for (int f = 0; f < DPTP_NFAULTS; f++)
		if (dptp_fault_on(o->inject, f))
			inject[rep.ninject++] = dptp_faults[f].name;
	rep.inject = inject;
	dptp_stop_gather();
	int grc = dptp_gather_results(b, l, res, nres, gather_timeout, &rep, &err);
	if (grc < 0)
		fprintf(stderr, "dptp-check: rank %d: gathering the results: %s\n", b->rank, err.msg);
	dptp_cli_fill_mech(&rep);
	enum dptp_status worst = DPTP_PASS;
	for (size_t k = 0; k < nres; k++)
		worst = k ? dptp_status_worst(worst, res[k].status) : res[k].status;
	int code = status_exit(worst);
	if (b->rank == 0 && dptp_stop_claim()) {
		if (startup && grc == -ETIMEDOUT)
			note_missing(&rep, err.msg);
		worst = dptp_report_worst(&rep);
		/* a report that could not be built whole is no verdict on what it lacks */
		if (grc < 0 && grc != -ETIMEDOUT && grc != -EPROTO)
			worst = dptp_status_worst(worst, DPTP_ERROR);
		code = dptp_cli_write_report(o, &rep, status_exit(worst), dptp_use_colour(STDOUT_FILENO));
		dptp_stop_done(code);
	}
	dptp_report_release(&rep);
	/* the verdict is the same on every rank; longer than rank 0 may spend
	 * gathering, so that it has written */
	code = dptp_cli_share_verdict(b, code, broken, gather_timeout + (broken ? 1.0 : 5.0));
	dptp_stop_done(code);
	return code;
}

/* A run that ends before the bootstrap told this process its rank: the
 * message on stderr, and, with --output, the report of checks not run
 * unless the environment names a rank other than 0 (every process of the
 * job may write it: one file, replaced atomically). Returns 3. */
static int early_exit(const struct dptp_options *o, bool cuda, const char *msg)
{
	fprintf(stderr, "dptp-check: %s\n", msg);
	if (o->output && dptp_stop_maybe_rank0() && dptp_stop_claim()) {
		char why[DPTP_ERR_MAX + 64];
		snprintf(why, sizeof(why), "not run: start-up: %s", msg);
		(void)dptp_stop_report_not_run(o, NULL, 0, cuda, DPTP_ERROR, why, EXIT_ENV, NULL, 0);
	}
	dptp_stop_done(EXIT_ENV); /* a signal from here on: exit 3 at once */
	return EXIT_ENV;
}

/* --help, --version, --list: printed, true; false for a run. */
static bool print_info(const struct dptp_options *o)
{
	if (o->help) {
		dptp_options_usage(stdout);
		return true;
	}
	if (o->version) {
		printf("dptp-check %s (backends: host%s%s)\n", DPTP_VERSION,
		       DPTP_HAVE_CUDA ? ", cuda" : "", DPTP_HAVE_NCCL ? ", nccl" : "");
		return true;
	}
	if (o->list) {
		print_list();
		return true;
	}
	return false;
}

/* After the bootstrap, a backend this run cannot have: rank 0 writes the
 * report while the others wait (a launcher ends the job at the first
 * exit). Returns the exit code, 3. */
static int backend_missing(const struct dptp_options *o, struct dptp_bootstrap *b, bool cuda, const char *no_backend)
{
	fprintf(stderr, "dptp-check: %s\n", no_backend);
	if (b->rank == 0 && o->output && dptp_stop_claim()) {
		char why[256];
		snprintf(why, sizeof(why), "not run: start-up: %s", no_backend);
		(void)dptp_stop_report_not_run(o, b, b->size, cuda, DPTP_ERROR, why, EXIT_ENV, NULL, 0);
	}
	int code = dptp_cli_share_verdict(b, EXIT_ENV, false, 5);
	dptp_stop_done(code);
	dptp_bootstrap_destroy(b);
	return code;
}

/* The start-up (dptp_ctx_init) failed with rc: the message, the report
 * and the start-up's own exit code (2 a layout that does not fit, 3 the
 * environment, 4 a timeout). Does not return while a fence is pending. */
static int startup_failed(const struct dptp_options *o, struct dptp_bootstrap *b, bool cuda, struct dptp_ctx *c,
			  int rc, const struct dptp_err *err)
{
	/* every rank finds the same layout problem: one line from rank 0 */
	bool usage = rc == -EINVAL && c->layout.world == 0;
	if (usage && b->rank == 0)
		fprintf(stderr, "dptp-check: %s\n", err->msg);
	else if (!usage)
		fprintf(stderr, "dptp-check: rank %d: %s\n", b->rank, err->msg);
	int code = usage ? EXIT_USAGE : (rc == -ETIMEDOUT ? EXIT_TIMEOUT : EXIT_ENV);
	bool stuck = c->x.broken;
	if (usage || o->bench) {
		/* rank 0's own words (every rank finds the same layout
		 * problem); the bench has no per-check results to gather */
		if (b->rank == 0 && o->output && dptp_stop_claim()) {
			char why[DPTP_ERR_MAX + 64];
			snprintf(why, sizeof(why), "not run: %s%s", usage ? "usage: " : "start-up: ", err->msg);
			/* the exit code stays the start-up's own */
			(void)dptp_stop_report_not_run(o, b, b->size, cuda,
						       rc == -ETIMEDOUT ? DPTP_TIMEOUT : DPTP_ERROR, why, code,
						       NULL, 0);
		}
		/* no rank leaves before rank 0 has said why (a launcher
		 * tears the job down at the first exit) */
		if (usage)
			dptp_cli_share_verdict(b, EXIT_USAGE, false, 5);
		dptp_stop_done(code);
	} else {
		/* the report still comes: every (replica, check) not run,
		 * and the ranks that never reported named; the others
		 * reach their own deadline about now */
		struct dptp_check_result res[DPTP_MAX_CHECKS];
		memset(res, 0, sizeof(res));
		size_t nres = startup_results(o, rc, err, res);
		dptp_stop_checks(res, nres, NULL); /* rank 0's part of a signal's report */
		/* the exit code stays the start-up's own (3: the
		 * environment, 4: a timeout), as without --output */
		(void)report_and_verdict(o, b, &c->layout, cuda, res, nres, o->timeout < 2 ? o->timeout : 2,
					 stuck, true);
		for (size_t k = 0; k < nres; k++)
			free(res[k].detail);
	}
	dptp_ctx_release(c);
	if (stuck)
		_exit(code); /* a fence is still pending in PMIx: don't wait for it */
	dptp_bootstrap_destroy(b);
	return code;
}

/* Runs the selected checks, in lockstep on every rank, gathers to rank 0
 * and writes the report. Returns the exit code; does not return while a
 * fence is pending. */
static int run_checks(const struct dptp_options *o, struct dptp_bootstrap *b, bool cuda, struct dptp_ctx *c)
{
	struct dptp_check_result res[DPTP_MAX_CHECKS];
	memset(res, 0, sizeof(res));
	size_t nres = dptp_cli_run_checks(o, c, res);

	/* gather to rank 0 and write the report; a rank that lost lockstep
	 * only waits briefly, so the job still ends within the timeout */
	bool was_broken = c->x.broken;
	int code = report_and_verdict(o, b, &c->layout, cuda, res, nres, was_broken ? 0.3 : o->timeout, was_broken,
				      false);
	/* (report_and_verdict let go of res for a signal's report) */
	for (size_t k = 0; k < nres; k++)
		free(res[k].detail);
	bool stuck = was_broken;
	dptp_ctx_release(c);
	if (stuck)
		_exit(code); /* a fence is still pending in PMIx: don't wait for it */
	dptp_bootstrap_destroy(b);
	return code;
}

int dptp_check_main(int argc, char **argv)
{
	struct dptp_options o;
	struct dptp_err err = {0};
	dptp_options_init(&o);
	if (dptp_options_parse(&o, argc, argv, &err) < 0) {
		fprintf(stderr, "dptp-check: %s\n", err.msg);
		return EXIT_USAGE;
	}
	if (print_info(&o))
		return EXIT_PASS;
	/* auto: GPUs when this build has CUDA and the machine has a device */
	bool cuda = o.backend == DPTP_BACKEND_CUDA ||
		    (o.backend == DPTP_BACKEND_AUTO && DPTP_HAVE_CUDA && dptp_cuda_visible_devices() > 0);
	/* from here on a signal (a launcher ending the job) still gets the
	 * report written; before any other thread exists */
	int src = dptp_stop_init(&o, cuda);
	if (src < 0)
		fprintf(stderr, "dptp-check: warning: no report on a signal: %s\n", strerror(-src));

	/* the checks allocate and free buffers of megabytes one after
	 * another: from the heap, kept after free, they reuse pages already
	 * faulted in (a first touch costs 3-12 us a page on a virtual
	 * machine) instead of a fresh mapping each time */
	mallopt(M_MMAP_THRESHOLD, 64 << 20);
	mallopt(M_TRIM_THRESHOLD, 256 << 20);

	struct dptp_bootstrap *b = NULL;
	if (dptp_bootstrap_create(&b, o.timeout, &err) < 0)
		return early_exit(&o, cuda, err.msg);
	dptp_stop_booted(b);
	const char *no_backend = cuda && !DPTP_HAVE_CUDA ? "--backend cuda: this dptp was built without CUDA (use --backend host)"
				 : o.bench && !cuda ? "--bench times the GPU kernels and needs the cuda backend "
						      "(no CUDA device visible, or --backend host)" : NULL;
	if (no_backend)
		return backend_missing(&o, b, cuda, no_backend);
	struct dptp_params p = {
		.dp = o.dp, .pp = o.pp, .tp = o.tp,
		.tokens = o.tokens, .hidden = o.hidden, .dtype = o.dtype,
		.seed = o.seed, .eps = o.eps, .timeout = o.timeout,
		.faults = o.inject, .cuda = cuda,
	};
	if (o.layouts)
		return dptp_check_sweep(&o, b, &p);
	dptp_stop_startup();
	test_ready(b);
	struct dptp_ctx c;
	int rc = dptp_ctx_init(&c, b, &p, &err);
	if (rc < 0)
		return startup_failed(&o, b, cuda, &c, rc, &err);
	if (o.bench) {
		dptp_stop_bench();
		return dptp_check_bench(&o, &c, b);
	}
	return run_checks(&o, b, cuda, &c);
}
