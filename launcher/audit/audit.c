/* dptp-run --audit (see audit.h). */
#include "audit/audit.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "audit/audit_analyze.h"
#include "output/logs.h"
#include "base/audit_rec.h"
#include "base/layout.h"
#include "report/report.h"

#ifndef DPTP_AUDIT_INSTALL_DIR
#define DPTP_AUDIT_INSTALL_DIR "/usr/local/lib/dptp/audit"
#endif
#define PRELOAD_NAME "libdptp-audit.so"

static const char mechs[] = "PRICGD";

struct audit {
	struct dptp_layout layout;
	bool have_layout;
	enum dptp_format format;
	const char *output;
	double hang;
	char recdir[PATH_MAX];  /* the recorders' folder */
	char preload[PATH_MAX]; /* "" when the library is not built */
	char dir[PATH_MAX];     /* the job's audit folder */
	char *own_dir;          /* mkdtemp'd by us (--log-dir /dev/null) */
	pthread_t watcher;
	bool watching;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	bool hung;              /* the watch ended an attempt: */
	int hung_attempt;       /* this one (a restart may follow) */
	char hang_msg[2048];
};

static bool exists(const char *path)
{
	return access(path, R_OK) == 0;
}

/* Beside the executable in the build tree (launcher/audit/), else where
 * meson installs them. */
static int find_recorders(struct audit *a, struct dptp_err *err)
{
	char exe[PATH_MAX], path[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	const char *cands[2] = {NULL, DPTP_AUDIT_INSTALL_DIR};
	char local[PATH_MAX + 16];
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
		snprintf(local, sizeof(local), "%s/audit", exe);
		cands[0] = local;
	}
	for (size_t i = 0; i < DPTP_ARRAY_LEN(cands); i++) {
		if (!cands[i])
			continue;
		snprintf(path, sizeof(path), "%s/sitecustomize.py", cands[i]);
		if (!exists(path))
			continue;
		snprintf(a->recdir, sizeof(a->recdir), "%s", cands[i]);
		snprintf(path, sizeof(path), "%s/" PRELOAD_NAME, cands[i]);
		if (exists(path))
			snprintf(a->preload, sizeof(a->preload), "%s", path);
		return 0;
	}
	return dptp_err_set(err, -ENOENT, "--audit: the recorders are not installed (no sitecustomize.py in '%s' or '%s')",
		cands[0] ? cands[0] : "?", DPTP_AUDIT_INSTALL_DIR);
}

static int parse_layout(const char *s, struct dptp_layout *l, struct dptp_err *err)
{
	unsigned dp, pp, tp;
	int n = 0;
	if (sscanf(s, "%ux%ux%u%n", &dp, &pp, &tp, &n) != 3 || s[n] || !dp || !pp || !tp || dp > DPTP_MAX_WORLD ||
	    pp > DPTP_MAX_WORLD || tp > DPTP_MAX_WORLD || (uint64_t)dp * pp * tp > DPTP_MAX_WORLD || !strchr("0123456789", s[0]))
		return dptp_err_set(err, -EINVAL, "--audit-layout '%s': expected DPxPPxTP, e.g. 2x1x2 (at most %d ranks)", s,
			DPTP_MAX_WORLD);
	return dptp_layout_init(l, (int)(dp * pp * tp), (int)dp, (int)pp, (int)tp, err);
}

int audit_create(struct audit **out, const struct audit_opts *o, struct dptp_err *err)
{
	struct audit *a;
	*out = NULL;
	if (!o->on) {
		if (o->layout || o->output || o->format || o->hang)
			return dptp_err_set(err, -EINVAL, "--audit-%s needs --audit",
				o->layout ? "layout" : o->output ? "output" : o->format ? "format" : "hang");
		return 0;
	}
	if (!(a = calloc(1, sizeof(*a))))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	a->format = DPTP_FORMAT_JSON;
	a->hang = 30;
	a->output = o->output;
	if (o->format) {
		if (!strcmp(o->format, "text"))
			a->format = DPTP_FORMAT_TEXT;
		else if (!strcmp(o->format, "junit"))
			a->format = DPTP_FORMAT_JUNIT;
		else if (strcmp(o->format, "json")) {
			free(a);
			return dptp_err_set(err, -EINVAL, "--audit-format '%s': expected text, json or junit", o->format);
		}
	}
	if (o->hang && dptp_parse_double(o->hang, 0.1, 86400, &a->hang) < 0) {
		free(a);
		return dptp_err_set(err, -EINVAL, "--audit-hang '%s': expected seconds in [0.1, 86400]", o->hang);
	}
	if (o->output && !*o->output) {
		free(a);
		return dptp_err_set(err, -EINVAL, "--audit-output '': expected a file name");
	}
	if (o->layout) {
		if (parse_layout(o->layout, &a->layout, err) < 0) {
			free(a);
			return -EINVAL;
		}
		a->have_layout = true;
	}
	if (find_recorders(a, err) < 0) {
		free(a);
		return -EINVAL;
	}
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cv, NULL);
	*out = a;
	return 0;
}

/* PYTHONPATH gets the recorders' folder first; LD_PRELOAD the library
 * last (the user's own preloads keep their order and precedence). */
static int put_env(struct audit *a, struct dptp_err *err)
{
	char pid[32];
	char *v = NULL;
	const char *old;
	int rc = 0;
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	old = getenv("PYTHONPATH");
	if (asprintf(&v, "%s%s%s", a->recdir, old && *old ? ":" : "", old && *old ? old : "") < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	rc |= setenv("PYTHONPATH", v, 1);
	free(v);
	if (a->preload[0]) {
		old = getenv("LD_PRELOAD");
		if (asprintf(&v, "%s%s%s", old && *old ? old : "", old && *old ? " " : "", a->preload) < 0)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		rc |= setenv("LD_PRELOAD", v, 1);
		rc |= setenv("DPTP_AUDIT_PRELOAD", a->preload, 1);
		free(v);
	}
	rc |= setenv(DPTP_AUDIT_DIR_ENV, a->dir, 1);
	rc |= setenv(DPTP_AUDIT_PPID_ENV, pid, 1);
	return rc ? dptp_err_set(err, -ENOMEM, "out of memory") : 0;
}

/* The records' total size: it grows while any recording rank progresses. */
static long long dir_size(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	long long sum = 0;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		struct stat st;
		if (e->d_name[0] != 'r' || fstatat(dirfd(d), e->d_name, &st, 0) < 0)
			continue;
		sum += (long long)st.st_size + 1;
	}
	closedir(d);
	return sum;
}

static void *watch(void *arg)
{
	struct audit *a = arg;
	long long last_size = -2;
	double last = dptp_now();
	pthread_mutex_lock(&a->mu);
	while (!a->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 250 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&a->cv, &a->mu, &ts);
		if (a->stop)
			continue;
		pthread_mutex_unlock(&a->mu);
		long long size = dir_size(a->dir);
		double now = dptp_now();
		char msg[sizeof(a->hang_msg)];
		pid_t pids[1024];
		size_t npids = 0;
		int pend = 0, att = -1;
		if (size != last_size) {
			last_size = size;
			last = now;
		} else if (now - last >= a->hang) {
			pend = audit_analyze_pending(a->dir, msg, sizeof(msg), pids, &npids, DPTP_ARRAY_LEN(pids), &att);
			last = now; /* nothing pending: look again a period later */
		}
		pthread_mutex_lock(&a->mu);
		if (pend == 1 && !a->stop && !(a->hung && att == a->hung_attempt)) {
			a->hung = true;
			a->hung_attempt = att;
			snprintf(a->hang_msg, sizeof(a->hang_msg), "%s", msg);
			fprintf(stderr, "dptp-run --audit: no rank progressed for %g s: %s; ending the job\n", a->hang, msg);
			/* each worker leads its own process group (spawn.c) */
			for (size_t i = 0; i < npids; i++)
				if (kill(-pids[i], SIGKILL) < 0)
					kill(pids[i], SIGKILL);
		}
	}
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

static void stop_watch(struct audit *a)
{
	if (a->watching) {
		pthread_mutex_lock(&a->mu);
		a->stop = true;
		pthread_cond_signal(&a->cv);
		pthread_mutex_unlock(&a->mu);
		pthread_join(a->watcher, NULL);
		a->watching = false;
	}
}

int audit_job_start(struct audit *a, const char *run_dir, struct dptp_err *err)
{
	if (!a)
		return 0;
	if (a->watching) /* a restart: the same folder, records per attempt */
		return 0;
	if (run_dir) {
		snprintf(a->dir, sizeof(a->dir), "%s/audit", run_dir);
		if (mkdir(a->dir, 0755) < 0 && errno != EEXIST)
			return dptp_err_set(err, -errno, "--audit: cannot create '%s': %s", a->dir, strerror(errno));
	} else {
		const char *tmp = getenv("TMPDIR");
		char tmpl[PATH_MAX];
		snprintf(tmpl, sizeof(tmpl), "%s/dptp_audit_XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(tmpl))
			return dptp_err_set(err, -errno, "--audit: cannot create a folder in '%s': %s", tmp && *tmp ? tmp : "/tmp",
				strerror(errno));
		snprintf(a->dir, sizeof(a->dir), "%s", tmpl);
		a->own_dir = strdup(tmpl);
	}
	DPTP_TRY(put_env(a, err));
	int rc = pthread_create(&a->watcher, NULL, watch, a);
	if (rc)
		return dptp_err_set(err, -rc, "--audit: cannot start the hang watch: %s", strerror(rc));
	a->watching = true;
	return 0;
}

/* ---- the report ----------------------------------------------------- */

struct view {
	const struct audit *a;
	const struct audit_result *res;
	struct dptp_layout shown; /* the layout, or one replica of everything */
	int job_status;
	int *ranks;               /* room for a replica's ranks */
};

static bool finding_in(const struct view *v, const struct audit_finding *f, int dp)
{
	if (!v->res->layout_known)
		return true;
	for (size_t i = 0; i < f->nreplicas; i++)
		if (f->replicas[i] == dp)
			return true;
	/* a finding that names no replica (no rank of the layout) counts for all */
	return f->nreplicas == 0;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	dptp_json_escape(f, s, strlen(s));
	fputc('"', f);
}

static void json_ints(FILE *f, const int *v, size_t n)
{
	fputc('[', f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%d", i ? ", " : "", v[i]);
	fputc(']', f);
}

static void replica_ranks(const struct view *v, int dp, int *ranks, int *n)
{
	const struct dptp_layout *l = &v->shown;
	int per = l->pp * l->tp;
	*n = 0;
	for (int r = dp * per; r < (dp + 1) * per && r < l->world; r++)
		ranks[(*n)++] = r;
}

static int write_json(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_result *res = v->res;
	const struct dptp_layout *l = &v->shown;
	int *ranks = v->ranks, n;
	fprintf(f, "{\"tool\": \"dptp-run --audit\", \"version\": \"%s\",\n \"layout\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"tp\": %d, \"known\": %s, \"how\": ",
		DPTP_VERSION, res->world, l->dp, l->pp, l->tp, res->layout_known ? "true" : "false");
	json_str(f, res->layout_how);
	fprintf(f, "},\n \"attempt\": %d, \"ranks_recorded\": %zu, \"records\": %zu, \"hung\": %s, \"job_status\": %d, \"records_dir\": ",
		res->attempt, res->nrecorded, res->nrecords, v->a->hung ? "true" : "false", v->job_status);
	json_str(f, v->a->dir);
	fputs(",\n \"replicas\": [", f);
	for (int d = 0; res->world && d < l->dp; d++) {
		replica_ranks(v, d, ranks, &n);
		fprintf(f, "%s\n  {\"dp\": %d, \"ranks\": ", d ? "," : "", d);
		json_ints(f, ranks, (size_t)n);
		fputs(", \"mechanisms\": {", f);
		bool any = false;
		for (const char *m = mechs; *m; m++) {
			bool fail = false;
			for (size_t i = 0; i < res->nf; i++)
				fail |= res->f[i].mech == *m && finding_in(v, &res->f[i], d);
			any |= fail;
			fprintf(f, "%s\"%c\": \"%s\"", m == mechs ? "" : ", ", *m, fail ? "fail" : "pass");
		}
		fprintf(f, "}, \"status\": \"%s\"}", any ? "fail" : "pass");
	}
	fputs("],\n \"findings\": [", f);
	for (size_t i = 0; i < res->nf; i++) {
		const struct audit_finding *x = &res->f[i];
		fprintf(f, "%s\n  {\"mechanism\": \"%c\", \"replicas\": ", i ? "," : "", x->mech);
		json_ints(f, x->replicas, x->nreplicas);
		fputs(", \"ranks\": ", f);
		json_ints(f, x->ranks, x->nranks);
		fputs(", \"site\": ", f);
		json_str(f, x->site);
		fputs(", \"op\": ", f);
		json_str(f, x->op);
		fputs(", \"group\": ", f);
		json_ints(f, x->group, x->ngroup);
		fputs(", \"detail\": ", f);
		json_str(f, x->detail);
		fputc('}', f);
	}
	fputs("]}\n", f);
	return ferror(f) ? -EIO : 0;
}

static int write_text(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_result *res = v->res;
	const struct dptp_layout *l = &v->shown;
	int *ranks = v->ranks, n;
	if (!res->world) {
		fprintf(f, "dptp-run --audit: nothing was recorded (no worker ran the recorders); records in %s\n", v->a->dir);
		return ferror(f) ? -EIO : 0;
	}
	fprintf(f, "dptp-run --audit: world %d = dp %d x pp %d x tp %d (%s), %zu rank%s recorded, attempt %d%s\n", res->world,
		l->dp, l->pp, l->tp, res->layout_how, res->nrecorded, res->nrecorded == 1 ? "" : "s", res->attempt,
		v->a->hung ? ", ended as hung" : "");
	for (int d = 0; d < l->dp; d++) {
		bool any = false;
		replica_ranks(v, d, ranks, &n);
		for (size_t i = 0; i < res->nf; i++)
			any |= finding_in(v, &res->f[i], d);
		fprintf(f, "\nDP replica %d (rank%s ", d, n == 1 ? "" : "s");
		for (int i = 0; i < n; i++)
			fprintf(f, "%s%d", i ? "," : "", ranks[i]);
		fprintf(f, "): %s\n", any ? "FAIL" : "pass");
		for (const char *m = mechs; *m; m++) {
			size_t nm = 0;
			for (size_t i = 0; i < res->nf; i++)
				if (res->f[i].mech == *m && finding_in(v, &res->f[i], d)) {
					const struct audit_finding *x = &res->f[i];
					fprintf(f, "  %c  %s  ranks ", *m, nm ? "    " : "FAIL");
					for (size_t k = 0; k < x->nranks; k++)
						fprintf(f, "%s%d", k ? "," : "", x->ranks[k]);
					fprintf(f, "%s%s: %s\n", x->site[0] ? " at " : "", x->site, x->detail);
					nm++;
				}
			if (!nm)
				fprintf(f, "  %c  pass\n", *m);
		}
	}
	fprintf(f, "\n%zu finding%s; records %s %s%s\n", res->nf, res->nf == 1 ? "" : "s", v->a->own_dir ? "were in" : "in",
		v->a->dir, v->a->own_dir ? " (removed: --log-dir /dev/null)" : "");
	return ferror(f) ? -EIO : 0;
}

/* JUnit through dptp-check's writer: one case per (replica, mechanism),
 * named dp<d>/<mechanism>. */
static int write_junit(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_result *res = v->res;
	const struct dptp_layout *l = &v->shown;
	struct dptp_report r = {.tool = "dptp-run --audit", .version = DPTP_VERSION, .world = res->world, .dp = l->dp,
		.pp = l->pp, .tp = l->tp, .backend = "audit", .bootstrap = "torchrun", .engine = "dptp-run"};
	int rc = 0;
	r.nreplicas = res->world ? (size_t)l->dp : 0;
	r.replicas = calloc(r.nreplicas ? r.nreplicas : 1, sizeof(*r.replicas));
	if (!r.replicas)
		return -ENOMEM;
	for (size_t d = 0; d < r.nreplicas && rc == 0; d++) {
		struct dptp_replica_result *rep = &r.replicas[d];
		rep->dp = (int)d;
		rep->ranks = malloc(((size_t)l->world + 1) * sizeof(int));
		rep->checks = calloc(sizeof(mechs) - 1, sizeof(*rep->checks));
		if (!rep->ranks || !rep->checks) {
			rc = -ENOMEM;
			break;
		}
		replica_ranks(v, (int)d, rep->ranks, &rep->nranks);
		rep->status = DPTP_PASS;
		for (const char *m = mechs; *m && rc == 0; m++) {
			struct dptp_check_result *c = &rep->checks[rep->nchecks++];
			char *detail = strdup("");
			snprintf(c->name, sizeof(c->name), "%c", *m);
			c->status = DPTP_PASS;
			for (size_t i = 0; i < res->nf && detail; i++) {
				const struct audit_finding *x = &res->f[i];
				char *nd;
				if (x->mech != *m || !finding_in(v, x, (int)d))
					continue;
				c->status = DPTP_FAIL;
				if (asprintf(&nd, "%s%s%s%s%s", detail, *detail ? "\n" : "", x->site, x->site[0] ? ": " : "", x->detail) < 0)
					nd = NULL;
				free(detail);
				detail = nd;
			}
			if (!(c->detail = detail))
				rc = -ENOMEM;
			rep->status = dptp_status_worst(rep->status, c->status);
		}
	}
	if (rc == 0)
		rc = dptp_report_write_junit(&r, f);
	dptp_report_release(&r);
	return rc;
}

int audit_finish(struct audit *a, int job_status, FILE *errs)
{
	struct audit_result res;
	struct dptp_err err = {0};
	int status = job_status;
	if (!a)
		return job_status;
	stop_watch(a);
	if (!a->dir[0]) /* the job never started workers */
		return job_status;
	const struct dptp_layout *given = a->have_layout ? &a->layout : NULL;
	int rc = audit_analyze(a->dir, given, a->hung, &res, &err);
	if (rc == 0 && a->hung && res.attempt != a->hung_attempt) {
		a->hung = false; /* the hang was an earlier attempt's, restarted since */
		audit_analyze_result_release(&res);
		rc = audit_analyze(a->dir, given, false, &res, &err);
	}
	if (rc < 0) {
		fprintf(errs, "dptp-run --audit: error: %s\n", err.msg);
		audit_analyze_result_release(&res);
		return job_status ? job_status : 1;
	}
	struct view v = {.a = a, .res = &res, .job_status = job_status};
	if (res.layout_known)
		v.shown = res.layout;
	else
		dptp_layout_init(&v.shown, res.world ? res.world : 1, 1, 1, res.world ? res.world : 1, NULL);
	if (!(v.ranks = malloc(((size_t)v.shown.world + 1) * sizeof(int)))) {
		audit_analyze_result_release(&res);
		return job_status ? job_status : 1;
	}
	fputc('\n', errs);
	write_text(&v, errs);
	fflush(errs);
	if (a->output) {
		int (*emit)(void *, FILE *) = a->format == DPTP_FORMAT_TEXT ? write_text
					     : a->format == DPTP_FORMAT_JUNIT ? write_junit : write_json;
		if (dptp_write_file_with(a->output, emit, &v, &err) < 0) {
			fprintf(errs, "dptp-run --audit: error: %s\n", err.msg);
			if (!status)
				status = 1;
		}
	}
	if (!status && res.nf)
		status = 1;
	free(v.ranks);
	audit_analyze_result_release(&res);
	return status;
}

void audit_destroy(struct audit *a)
{
	if (!a)
		return;
	stop_watch(a);
	pthread_mutex_destroy(&a->mu);
	pthread_cond_destroy(&a->cv);
	if (a->own_dir)
		dptp_rm_tree(a->own_dir);
	free(a->own_dir);
	free(a);
}
