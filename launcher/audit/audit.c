/* dptp-run --audit (see audit.h). */
#include "audit/audit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* What the watch knows of one records file: its name and how far it has
 * been read for `world` records (the default hang bound). */
struct wfile {
	char name[96];
	off_t scanned;
	bool seen; /* in the folder at the last look */
};

/* This node's workers of the running attempt (audit_worker_started). */
struct wslot {
	int rank;
	pid_t pid;
	bool alive;
};

struct audit {
	struct dptp_layout layout;
	bool have_layout;
	enum dptp_format format;
	bool format_given;
	const char *output;     /* NULL: none; "-": stdout */
	double hang;            /* 0: no watch; <0: torch's timeout from the records */
	bool keep;
	bool in_log_dir;        /* --log-dir DIR: the records stay in <run_dir>/audit */
	char recdir[PATH_MAX];  /* the recorders' folder */
	char preload[PATH_MAX]; /* "" when the library is not built */
	char dir[PATH_MAX];     /* the job's audit folder */
	char *own_dir;          /* mkdtemp'd by us, removed unless --audit-keep */
	int lfd;                /* launcher.jsonl */
	pthread_t watcher;
	bool watching;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	/* under mu: */
	struct wslot *slots;
	unsigned nslots;
	unsigned att;           /* the running attempt */
	bool hung;              /* the watch ended an attempt: */
	int hung_attempt;       /* the last such */
	unsigned nhangs;
	uint64_t hung_mask;     /* attempts 0..63 the watch ended */
	char hang_msg[2048];
	struct audit_exit *exits; /* every worker's exit (grows with workers x attempts) */
	size_t nexits, capexits;
	/* the watch thread's own: */
	struct wfile *files;
	size_t nfiles, capfiles;
	double world_timeout;   /* largest `timeout` of the world records, 0 none */
	bool world_nccl;        /* a world of the nccl backend was recorded */
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

/* One dimension of the layout: decimal digits only (no sign, no space),
 * at most DPTP_MAX_WORLD, never wrapped. */
static bool parse_dim(const char **s, unsigned *v)
{
	const char *p = *s;
	unsigned long x = 0;
	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		x = x * 10 + (unsigned long)(*p - '0');
		if (x > DPTP_MAX_WORLD)
			return false;
	}
	*v = (unsigned)x;
	*s = p;
	return x > 0;
}

static int parse_layout(const char *s, unsigned world, struct dptp_layout *l, struct dptp_err *err)
{
	unsigned d[3];
	const char *p = s;
	bool ok = true;
	for (int i = 0; i < 3 && ok; i++) {
		ok = parse_dim(&p, &d[i]);
		if (ok && i < 2)
			ok = *p++ == 'x';
	}
	if (!ok || *p || (uint64_t)d[0] * d[1] * d[2] > DPTP_MAX_WORLD)
		return dptp_err_set(err, -EINVAL, "--audit-layout '%s': expected DPxPPxTP in decimal, e.g. 2x1x2 (at most %d ranks)", s,
			DPTP_MAX_WORLD);
	unsigned n = d[0] * d[1] * d[2];
	if (world && n != world)
		return dptp_err_set(err, -EINVAL, "--audit-layout '%s' is %u ranks; the job's world is %u (nnodes x nproc-per-node)", s,
			n, world);
	return dptp_layout_init(l, (int)n, (int)d[0], (int)d[1], (int)d[2], err);
}

static bool to_stdout(const char *path)
{
	return !strcmp(path, "-") || !strcmp(path, "/dev/stdout");
}

/* --audit-output must name a regular file that the report can replace or
 * create (written atomically at the end: a new file in its folder, then
 * renamed), or "-"//dev/stdout. Tried now with a file of our own, removed
 * at once: a missing folder, a directory, a device or a folder that takes
 * no new file (/proc) is refused before the job. */
static int check_output(const char *path, struct dptp_err *err)
{
	struct stat st;
	if (!*path)
		return dptp_err_set(err, -EINVAL, "--audit-output '': expected a file name");
	if (to_stdout(path))
		return 0;
	const char *slash = strrchr(path, '/');
	if (slash && !slash[1])
		return dptp_err_set(err, -EINVAL, "--audit-output '%s': names a folder, expected a file", path);
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return dptp_err_set(err, -EINVAL, "--audit-output '%s': is a folder, expected a file", path);
		if (!S_ISREG(st.st_mode))
			return dptp_err_set(err, -EINVAL, "--audit-output '%s': is a %s, not a regular file (use - for stdout)", path,
				S_ISCHR(st.st_mode) ? "character device" : S_ISFIFO(st.st_mode) ? "FIFO"
				: S_ISSOCK(st.st_mode) ? "socket" : "special file");
	} else if (errno != ENOENT) {
		return dptp_err_set(err, -EINVAL, "--audit-output '%s': %s", path, strerror(errno));
	}
	char dir[PATH_MAX];
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	if (stat(dir, &st) < 0)
		return dptp_err_set(err, -EINVAL, "--audit-output '%s': the folder '%s' does not exist", path, dir);
	if (!S_ISDIR(st.st_mode))
		return dptp_err_set(err, -EINVAL, "--audit-output '%s': '%s' is not a folder", path, dir);
	char probe[PATH_MAX + 32];
	snprintf(probe, sizeof(probe), "%s/.dptp-audit-probe.XXXXXX", dir);
	int fd = mkostemp(probe, O_CLOEXEC);
	if (fd < 0)
		return dptp_err_set(err, -EINVAL, "--audit-output '%s': no file can be created in '%s' (%s)", path, dir,
			errno == ENOENT ? "it takes no new files" : strerror(errno));
	close(fd);
	unlink(probe);
	return 0;
}

int audit_create(struct audit **out, const struct audit_opts *o, struct dptp_err *err)
{
	struct audit *a;
	*out = NULL;
	if (!o->on) {
		if (o->layout || o->output || o->format || o->hang || o->keep)
			return dptp_err_set(err, -EINVAL, "--audit-%s needs --audit",
				o->layout ? "layout" : o->output ? "output" : o->format ? "format" : o->hang ? "hang" : "keep");
		return 0;
	}
	if (!(a = calloc(1, sizeof(*a))))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	a->lfd = -1;
	a->format = DPTP_FORMAT_JSON;
	a->hang = -1;
	a->keep = o->keep;
	a->in_log_dir = o->log_dir && strcmp(o->log_dir, "/dev/null");
	a->output = o->output;
	if (o->format) {
		a->format_given = true;
		if (!strcmp(o->format, "text"))
			a->format = DPTP_FORMAT_TEXT;
		else if (!strcmp(o->format, "junit"))
			a->format = DPTP_FORMAT_JUNIT;
		else if (strcmp(o->format, "json")) {
			free(a);
			return dptp_err_set(err, -EINVAL, "--audit-format '%s': expected text, json or junit", o->format);
		}
	}
	if (o->hang && (dptp_parse_double(o->hang, 0, 86400, &a->hang) < 0 || (a->hang > 0 && a->hang < 0.1))) {
		free(a);
		return dptp_err_set(err, -EINVAL, "--audit-hang '%s': expected seconds, 0 (no watch) or in [0.1, 86400]", o->hang);
	}
	if (o->output && check_output(o->output, err) < 0) {
		free(a);
		return -EINVAL;
	}
	if (o->layout) {
		if (parse_layout(o->layout, o->world, &a->layout, err) < 0) {
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

/* ---- launcher.jsonl: what dptp-run saw of its workers ---------------- */

/* One record, one write(2) (O_APPEND): the watch thread and the
 * supervisor write side by side. */
__attribute__((format(printf, 2, 3)))
static void lrec(struct audit *a, const char *fmt, ...)
{
	char buf[2400];
	va_list ap;
	if (a->lfd < 0)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(a->lfd, buf, (size_t)n) < 0) {
		/* a full disk: the analysis finds the record missing and says so */
	}
}

void audit_worker_started(struct audit *a, int rank, int local_rank, pid_t pid, unsigned att)
{
	if (!a)
		return;
	pthread_mutex_lock(&a->mu);
	if (att != a->att) {
		for (unsigned i = 0; i < a->nslots; i++)
			a->slots[i].alive = false;
		a->att = att;
	}
	if (local_rank >= 0 && (unsigned)local_rank < a->nslots)
		a->slots[local_rank] = (struct wslot){.rank = rank, .pid = pid, .alive = true};
	lrec(a, "{\"k\":\"wstart\",\"rank\":%d,\"local_rank\":%d,\"pid\":%d,\"att\":%u,\"t\":%.6f}", rank, local_rank, (int)pid,
		att, dptp_now());
	pthread_mutex_unlock(&a->mu);
}

void audit_worker_exited(struct audit *a, int rank, pid_t pid, unsigned att, int st)
{
	char code[16] = "null", sig[16] = "null";
	if (!a)
		return;
	if (WIFEXITED(st))
		snprintf(code, sizeof(code), "%d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(sig, sizeof(sig), "%d", WTERMSIG(st));
	pthread_mutex_lock(&a->mu);
	for (unsigned i = 0; i < a->nslots; i++)
		if (a->slots[i].pid == pid)
			a->slots[i].alive = false;
	if (a->nexits == a->capexits) {
		size_t cap = a->capexits ? 2 * a->capexits : 16;
		struct audit_exit *e = realloc(a->exits, cap * sizeof(*e));
		if (e) {
			a->exits = e;
			a->capexits = cap;
		}
	}
	if (a->nexits < a->capexits)
		a->exits[a->nexits++] = (struct audit_exit){.rank = rank, .pid = pid, .attempt = (int)att,
			.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1, .sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0,
			.core = WIFSIGNALED(st) && WCOREDUMP(st), .t = dptp_now()};
	lrec(a, "{\"k\":\"wexit\",\"rank\":%d,\"pid\":%d,\"att\":%u,\"code\":%s,\"sig\":%s,\"core\":%s,\"t\":%.6f}", rank, (int)pid,
		att, code, sig, WIFSIGNALED(st) && WCOREDUMP(st) ? "true" : "false", dptp_now());
	pthread_mutex_unlock(&a->mu);
}

/* ---- the hang watch ------------------------------------------------- */

static bool is_records(const char *name)
{
	size_t n = strlen(name);
	return n > 6 && !strcmp(name + n - 6, ".jsonl") && name[0] != '.';
}

static struct wfile *wfile_get(struct audit *a, const char *name)
{
	for (size_t i = 0; i < a->nfiles; i++)
		if (!strcmp(a->files[i].name, name))
			return &a->files[i];
	if (strlen(name) >= sizeof(a->files[0].name))
		return NULL;
	if (a->nfiles == a->capfiles) {
		size_t cap = a->capfiles ? 2 * a->capfiles : 16;
		struct wfile *f = realloc(a->files, cap * sizeof(*f));
		if (!f)
			return NULL;
		a->files = f;
		a->capfiles = cap;
	}
	struct wfile *f = &a->files[a->nfiles++];
	memset(f, 0, sizeof(*f));
	snprintf(f->name, sizeof(f->name), "%s", name);
	return f;
}

/* The records' total size: it grows while any recording process
 * progresses. One stat per file: the cost follows the processes, not the
 * records. */
static long long dir_size(struct audit *a)
{
	DIR *d = opendir(a->dir);
	struct dirent *e;
	long long sum = 0;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		struct stat st;
		if (!is_records(e->d_name) || fstatat(dirfd(d), e->d_name, &st, 0) < 0)
			continue;
		sum += (long long)st.st_size + 1;
	}
	closedir(d);
	return sum;
}

/* A line `{"k":"world",...}`: its "timeout" (seconds) and backend. */
static void world_line(struct audit *a, const char *l)
{
	const char *t = strstr(l, "\"timeout\":");
	double v = 0;
	if (strstr(l, "\"backend\":\"nccl\"") || strstr(l, "\"backend\": \"nccl\""))
		a->world_nccl = true;
	if (t && sscanf(t + 10, " %lf", &v) == 1 && v > a->world_timeout)
		a->world_timeout = v;
}

/* Reads what the Python recorders wrote since the last look, for their
 * `world` records only: each byte is read once in the job, through one
 * fixed buffer. */
static void scan_worlds(struct audit *a)
{
	static char buf[1 << 16];
	DIR *d = opendir(a->dir);
	struct dirent *e;
	if (!d)
		return;
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n < 9 || strcmp(e->d_name + n - 9, ".py.jsonl"))
			continue;
		struct wfile *f = wfile_get(a, e->d_name);
		if (!f)
			continue;
		int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		for (;;) {
			ssize_t got = pread(fd, buf, sizeof(buf) - 1, f->scanned);
			if (got <= 0)
				break;
			buf[got] = '\0';
			char *end = memrchr(buf, '\n', (size_t)got);
			if (!end) { /* a line longer than the buffer (or torn): not a world record */
				if (got < (ssize_t)sizeof(buf) - 1)
					break;
				f->scanned += got;
				continue;
			}
			*end = '\0';
			for (char *l = buf; l && l < end;) {
				char *nl = strchr(l, '\n');
				if (nl)
					*nl = '\0';
				if (strstr(l, "\"k\":\"world\"") || strstr(l, "\"k\": \"world\""))
					world_line(a, l);
				l = nl ? nl + 1 : NULL;
			}
			f->scanned += end - buf + 1;
		}
		close(fd);
	}
	closedir(d);
}

/* --audit-hang, else torch's own bound: the largest process-group timeout
 * the world records carry, else torch's default (NCCL 600 s, gloo 1800 s). */
static double hang_bound(struct audit *a)
{
	if (a->hang > 0)
		return a->hang;
	if (a->world_timeout > 0)
		return a->world_timeout;
	return a->world_nccl ? 600 : 1800;
}

/* Ends the running attempt: SIGKILL to each of this node's live workers'
 * process groups (each leads its own, spawn.c) and to the recording
 * processes the analysis named. */
static void end_attempt(struct audit *a, const pid_t *pids, size_t npids)
{
	for (unsigned i = 0; i < a->nslots; i++)
		if (a->slots[i].alive && kill(-a->slots[i].pid, SIGKILL) < 0)
			kill(a->slots[i].pid, SIGKILL);
	for (size_t i = 0; i < npids; i++)
		if (kill(-pids[i], SIGKILL) < 0)
			kill(pids[i], SIGKILL);
}

/* s as the inside of a JSON string, cut to fit len */
static void json_buf(char *dst, size_t len, const char *s)
{
	size_t o = 0;
	for (; *s && o + 7 < len; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			dst[o++] = '\\';
			dst[o++] = (char)c;
		} else if (c < 0x20) {
			o += (size_t)snprintf(dst + o, len - o, "\\u%04x", c);
		} else {
			dst[o++] = (char)c;
		}
	}
	dst[o] = '\0';
}

static void *watch(void *arg)
{
	struct audit *a = arg;
	long long last_size = -2;
	double last = dptp_now(), scanned_at = 0;
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
		long long size = dir_size(a);
		double now = dptp_now();
		char msg[sizeof(a->hang_msg)];
		pid_t pids[1024];
		size_t npids = 0;
		int pend = 0, att = -1;
		if (size != last_size) {
			last_size = size;
			last = now;
		} else {
			/* still: the bound may come from records not read yet */
			if (a->hang < 0 && scanned_at < last) {
				scan_worlds(a);
				scanned_at = now;
			}
			if (now - last >= hang_bound(a)) {
				pend = audit_analyze_pending(a->dir, msg, sizeof(msg), pids, &npids, DPTP_ARRAY_LEN(pids), &att);
				last = now; /* nothing pending (a rank works outside any collective): look again a bound later */
			}
		}
		pthread_mutex_lock(&a->mu);
		if (pend == 1 && !a->stop && !(a->hung && att == a->hung_attempt)) {
			a->hung = true;
			a->hung_attempt = att;
			a->nhangs++;
			if (att >= 0 && att < 64)
				a->hung_mask |= (uint64_t)1 << att;
			snprintf(a->hang_msg, sizeof(a->hang_msg), "%s", msg);
			fprintf(stderr, "dptp-run --audit: no rank progressed for %g s: %s; ending the job\n", hang_bound(a), msg);
			char esc[1800]; /* fits lrec's line */
			json_buf(esc, sizeof(esc), msg);
			lrec(a, "{\"k\":\"hang\",\"att\":%d,\"t\":%.6f,\"bound\":%g,\"msg\":\"%s\"}", att, now, hang_bound(a), esc);
			end_attempt(a, pids, npids);
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

/* With --log-dir DIR the records are the run's: <run_dir>/audit, kept.
 * Else a temporary folder, removed after the report (--audit-keep: kept). */
static int make_dir(struct audit *a, const char *run_dir, struct dptp_err *err)
{
	if (run_dir && a->in_log_dir) {
		snprintf(a->dir, sizeof(a->dir), "%s/audit", run_dir);
		if (mkdir(a->dir, 0755) < 0 && errno != EEXIST)
			return dptp_err_set(err, -errno, "--audit: cannot create '%s': %s", a->dir, strerror(errno));
		return 0;
	}
	const char *tmp = getenv("TMPDIR");
	char tmpl[PATH_MAX];
	snprintf(tmpl, sizeof(tmpl), "%s/dptp_audit_XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmpl))
		return dptp_err_set(err, -errno, "--audit: cannot create a folder in '%s': %s", tmp && *tmp ? tmp : "/tmp",
			strerror(errno));
	snprintf(a->dir, sizeof(a->dir), "%s", tmpl);
	if (!(a->own_dir = strdup(tmpl))) {
		rmdir(tmpl);
		a->dir[0] = '\0';
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	return 0;
}

int audit_job_start(struct audit *a, const char *run_dir, unsigned nworkers, struct dptp_err *err)
{
	if (!a)
		return 0;
	if (a->watching || a->dir[0]) /* a restart: the same folder, records per attempt */
		return 0;
	if (!(a->slots = calloc(nworkers ? nworkers : 1, sizeof(*a->slots))))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	a->nslots = nworkers;
	DPTP_TRY(make_dir(a, run_dir, err));
	char path[PATH_MAX + 32];
	snprintf(path, sizeof(path), "%s/launcher.jsonl", a->dir);
	if ((a->lfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0)
		return dptp_err_set(err, -errno, "--audit: cannot create '%s': %s", path, strerror(errno));
	DPTP_TRY(put_env(a, err));
	if (a->hang == 0) /* --audit-hang 0: no watch */
		return 0;
	int rc = pthread_create(&a->watcher, NULL, watch, a);
	if (rc)
		return dptp_err_set(err, -rc, "--audit: cannot start the hang watch: %s", strerror(rc));
	a->watching = true;
	return 0;
}

/* ---- the report ----------------------------------------------------- */

/* the records' folder goes after the report */
static bool removed(const struct audit *a)
{
	return a->own_dir && !a->keep;
}

/* A replica's or the job's verdict: a finding fails; else anything not
 * recorded makes it incomplete (never a pass); else pass. */
enum verdict { V_PASS, V_INCOMPLETE, V_FAIL };
static const char *const vjson[] = {"pass", "incomplete", "fail"};
static const char *const vtext[] = {"pass", "INCOMPLETE", "FAIL"};

struct view {
	const struct audit *a;
	const struct audit_report *rep;
	int job_status;
	int hung_attempt;         /* -1: no hang ended an attempt */
	enum verdict v;           /* the job's */
	size_t nf, ngaps;         /* over every world, and the job's gaps */
};

/* the layout shown for a world: its own, or one replica of all its ranks */
static struct dptp_layout shown(const struct audit_result *w)
{
	struct dptp_layout l;
	if (w->layout_known)
		return w->layout;
	dptp_layout_init(&l, w->world > 0 ? w->world : 1, 1, 1, w->world > 0 ? w->world : 1, NULL);
	return l;
}

static bool finding_in(const struct audit_result *w, const struct audit_finding *f, int dp)
{
	if (!w->layout_known)
		return true;
	for (size_t i = 0; i < f->nreplicas; i++)
		if (f->replicas[i] == dp)
			return true;
	/* a finding that names no replica (no rank of the layout) counts for all */
	return f->nreplicas == 0;
}

/* a gap without a rank, or in an unknown layout, touches every replica */
static bool gap_in(const struct audit_result *w, const struct audit_gap *g, int dp)
{
	struct dptp_layout l = shown(w);
	int per = l.pp * l.tp;
	return !w->layout_known || g->rank < 0 || g->rank / per == dp;
}

static enum verdict mech_verdict(const struct audit_result *w, int dp, char m)
{
	for (size_t i = 0; i < w->nf; i++)
		if ((!m || w->f[i].mech == m) && finding_in(w, &w->f[i], dp))
			return V_FAIL;
	if (w->capped)
		return V_INCOMPLETE;
	for (size_t i = 0; i < w->ngaps; i++)
		if (gap_in(w, &w->gaps[i], dp))
			return V_INCOMPLETE;
	return V_PASS;
}

static enum verdict replica_verdict(const struct audit_result *w, int dp)
{
	enum verdict v = V_PASS;
	for (const char *m = mechs; *m; m++) {
		enum verdict x = mech_verdict(w, dp, *m);
		v = x > v ? x : v;
	}
	return v;
}

static enum verdict world_verdict(const struct audit_result *w)
{
	struct dptp_layout l = shown(w);
	enum verdict v = w->nf ? V_FAIL : w->ngaps || w->capped || !w->world ? V_INCOMPLETE : V_PASS;
	for (int d = 0; d < l.dp; d++) {
		enum verdict x = replica_verdict(w, d);
		v = x > v ? x : v;
	}
	return v;
}

static void view_init(struct view *v)
{
	const struct audit_report *rep = v->rep;
	v->v = rep->nw && !rep->ngaps ? V_PASS : V_INCOMPLETE;
	v->ngaps = rep->ngaps;
	for (size_t i = 0; i < rep->nw; i++) {
		enum verdict x = world_verdict(&rep->w[i]);
		v->v = x > v->v ? x : v->v;
		v->nf += rep->w[i].nf;
		v->ngaps += rep->w[i].ngaps;
	}
}

static void replica_ranks(const struct dptp_layout *l, int dp, int *n, int *first)
{
	int per = l->pp * l->tp;
	*first = dp * per;
	*n = (dp + 1) * per <= l->world ? per : l->world - dp * per;
	if (*n < 0)
		*n = 0;
}

static const char *sig_name(int sig, char *buf, size_t len)
{
	const char *ab = sigabbrev_np(sig);
	if (ab)
		snprintf(buf, len, "SIG%s", ab);
	else
		snprintf(buf, len, "signal %d", sig);
	return buf;
}

/* ---- JSON ---- */

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

static void json_range(FILE *f, int first, int n)
{
	fputc('[', f);
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%d", i ? ", " : "", first + i);
	fputc(']', f);
}

static void json_gaps(FILE *f, const struct audit_gap *g, size_t n)
{
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{\"rank\": %d, \"pid\": %d, \"attempt\": %d, \"why\": ", i ? ", " : "", g[i].rank, (int)g[i].pid,
			g[i].attempt);
		json_str(f, g[i].why);
		fputc('}', f);
	}
	fputc(']', f);
}

static void json_layout(FILE *f, const struct audit_result *w)
{
	struct dptp_layout l = shown(w);
	fprintf(f, "{\"world\": %d, \"dp\": %d, \"pp\": %d, \"tp\": %d, \"known\": %s, \"how\": ", w->world, l.dp, l.pp, l.tp,
		w->layout_known ? "true" : "false");
	json_str(f, w->layout_how);
	fputc('}', f);
}

static void json_replicas(FILE *f, const struct audit_result *w)
{
	struct dptp_layout l = shown(w);
	fputc('[', f);
	for (int d = 0; w->world && d < l.dp; d++) {
		int n, first;
		replica_ranks(&l, d, &n, &first);
		fprintf(f, "%s\n  {\"dp\": %d, \"ranks\": ", d ? "," : "", d);
		json_range(f, first, n);
		fputs(", \"mechanisms\": {", f);
		for (const char *m = mechs; *m; m++)
			fprintf(f, "%s\"%c\": \"%s\"", m == mechs ? "" : ", ", *m, vjson[mech_verdict(w, d, *m)]);
		fprintf(f, "}, \"status\": \"%s\"}", vjson[replica_verdict(w, d)]);
	}
	fputc(']', f);
}

static void json_trail(FILE *f, const struct audit_finding *x)
{
	fputc('[', f);
	for (size_t i = 0; i < x->ntrail; i++) {
		const struct audit_trail *t = &x->trail[i];
		fprintf(f, "%s{\"rank\": %d, \"pid\": %d, \"calls\": [", i ? ", " : "", t->rank, (int)t->pid);
		for (size_t k = 0; k < t->n; k++) {
			fprintf(f, "%s{\"seq\": %lld, \"op\": ", k ? ", " : "", t->c[k].seq);
			json_str(f, t->c[k].op);
			fputs(", \"group\": ", f);
			json_str(f, t->c[k].group);
			fputs(", \"site\": ", f);
			json_str(f, t->c[k].site);
			fprintf(f, ", \"open\": %s}", t->c[k].open ? "true" : "false");
		}
		fputs("]}", f);
	}
	fputc(']', f);
}

static void json_finding(FILE *f, const struct audit_finding *x)
{
	fprintf(f, "{\"mechanism\": \"%c\", \"world\": ", x->mech);
	json_str(f, x->world_id);
	fprintf(f, ", \"attempt\": %d, \"replicas\": ", x->attempt);
	json_ints(f, x->replicas, x->nreplicas);
	fputs(", \"ranks\": ", f);
	json_ints(f, x->ranks, x->nranks);
	fputs(", \"site\": ", f);
	json_str(f, x->site ? x->site : "");
	fputs(", \"op\": ", f);
	json_str(f, x->op);
	fputs(", \"group\": ", f);
	json_ints(f, x->group, x->ngroup);
	fputs(", \"detail\": ", f);
	json_str(f, x->detail ? x->detail : "");
	if (x->ntrail) {
		fputs(", \"trail\": ", f);
		json_trail(f, x);
	}
	fputc('}', f);
}

/* the world shown at the top level, for readers of one world: the last
 * attempt's first */
static const struct audit_result *main_world(const struct audit_report *rep)
{
	const struct audit_result *m = NULL;
	for (size_t i = 0; i < rep->nw; i++)
		if (!m || rep->w[i].attempt > m->attempt)
			m = &rep->w[i];
	return m;
}

static int write_json(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_report *rep = v->rep;
	const struct audit_result *m = main_world(rep);
	static const struct audit_result none = {.layout_how = "nothing was recorded"};
	fprintf(f, "{\"tool\": \"dptp-run --audit\", \"version\": \"%s\", \"status\": \"%s\",\n \"layout\": ", DPTP_VERSION,
		vjson[v->v]);
	json_layout(f, m ? m : &none);
	fprintf(f, ",\n \"attempt\": %d, \"attempts\": %d, \"ranks_recorded\": %zu, \"records\": %zu, \"hung\": %s, \"hung_attempt\": %d, \"hangs\": %u, \"job_status\": %d, \"records_dir\": ",
		rep->attempts > 0 ? rep->attempts - 1 : 0, rep->attempts, m ? m->nrecorded : 0, rep->nrecords,
		v->hung_attempt >= 0 ? "true" : "false", v->hung_attempt, v->a->nhangs, v->job_status);
	json_str(f, v->a->dir);
	fputs(",\n \"replicas\": ", f);
	json_replicas(f, m ? m : &none);
	fputs(",\n \"worlds\": [", f);
	for (size_t i = 0; i < rep->nw; i++) {
		const struct audit_result *w = &rep->w[i];
		fprintf(f, "%s\n  {\"id\": ", i ? "," : "");
		json_str(f, w->world_id);
		fprintf(f, ", \"attempt\": %d, \"status\": \"%s\", \"ranks_recorded\": %zu, \"records\": %zu, \"capped\": %s, \"layout\": ",
			w->attempt, vjson[world_verdict(w)], w->nrecorded, w->nrecords, w->capped ? "true" : "false");
		json_layout(f, w);
		fputs(", \"gaps\": ", f);
		json_gaps(f, w->gaps, w->ngaps);
		fputs(", \"replicas\": ", f);
		json_replicas(f, w);
		fputc('}', f);
	}
	fputs("],\n \"findings\": [", f);
	size_t k = 0;
	for (size_t i = 0; i < rep->nw; i++)
		for (size_t j = 0; j < rep->w[i].nf; j++) {
			fputs(k++ ? ",\n  " : "\n  ", f);
			json_finding(f, &rep->w[i].f[j]);
		}
	fputs("],\n \"gaps\": ", f);
	json_gaps(f, rep->gaps, rep->ngaps);
	fputs(",\n \"exits\": [", f);
	for (size_t i = 0; i < v->a->nexits; i++) {
		const struct audit_exit *e = &v->a->exits[i];
		fprintf(f, "%s{\"rank\": %d, \"pid\": %d, \"attempt\": %d, ", i ? ", " : "", e->rank, (int)e->pid, e->attempt);
		if (e->sig)
			fprintf(f, "\"code\": null, \"sig\": %d, \"core\": %s}", e->sig, e->core ? "true" : "false");
		else
			fprintf(f, "\"code\": %d, \"sig\": null, \"core\": false}", e->code);
	}
	fputs("]}\n", f);
	return ferror(f) ? -EIO : 0;
}

/* ---- text ---- */

static void text_ranks(FILE *f, const int *r, size_t n)
{
	for (size_t k = 0; k < n; k++)
		fprintf(f, "%s%d", k ? "," : "", r[k]);
}

/* a hang's last collectives, one column per rank, the last ones on one row */
static void text_trail(FILE *f, const struct audit_finding *x)
{
	enum { W = 44 };
	size_t rows = 0;
	for (size_t i = 0; i < x->ntrail; i++)
		rows = x->trail[i].n > rows ? x->trail[i].n : rows;
	fputs("       last collectives, oldest first (* entered, not left):\n       ", f);
	for (size_t i = 0; i < x->ntrail; i++) {
		char h[W + 1];
		snprintf(h, sizeof(h), "rank %d (pid %d)", x->trail[i].rank, (int)x->trail[i].pid);
		fprintf(f, "%-*s", W, h);
	}
	fputc('\n', f);
	for (size_t r = 0; r < rows; r++) {
		fputs("       ", f);
		for (size_t i = 0; i < x->ntrail; i++) {
			const struct audit_trail *t = &x->trail[i];
			char cell[W + 1] = "";
			if (r + t->n >= rows) {
				const struct audit_call *c = &t->c[r + t->n - rows];
				const char *base = strrchr(c->site, '/');
				snprintf(cell, W - 1, "%lld %s%s [%s] %s", c->seq, c->op, c->open ? "*" : "", c->group,
					base ? base + 1 : c->site);
			}
			fprintf(f, "%-*s", W, cell);
		}
		fputc('\n', f);
	}
}

static void text_gaps(FILE *f, const char *indent, const struct audit_gap *g, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%snot recorded: ", indent);
		if (g[i].rank >= 0)
			fprintf(f, "rank %d ", g[i].rank);
		if (g[i].pid > 0)
			fprintf(f, "(pid %d) ", (int)g[i].pid);
		fprintf(f, "attempt %d: %s\n", g[i].attempt, g[i].why);
	}
}

static bool hung_in(const struct view *v, int att)
{
	return att == v->hung_attempt || (att >= 0 && att < 64 && (v->a->hung_mask >> att & 1));
}

static void text_world(const struct view *v, const struct audit_result *w, FILE *f)
{
	struct dptp_layout l = shown(w);
	fprintf(f, "dptp-run --audit: world %d = dp %d x pp %d x tp %d (%s), %zu rank%s recorded, attempt %d%s%s%s%s\n", w->world,
		l.dp, l.pp, l.tp, w->layout_how, w->nrecorded, w->nrecorded == 1 ? "" : "s", w->attempt,
		w->world_id[0] ? ", world " : "", w->world_id, hung_in(v, w->attempt) ? ", ended as hung" : "",
		w->capped ? ", record cap reached" : "");
	for (int d = 0; d < l.dp; d++) {
		int n, first;
		replica_ranks(&l, d, &n, &first);
		fprintf(f, "\nDP replica %d (rank%s ", d, n == 1 ? "" : "s");
		for (int i = 0; i < n; i++)
			fprintf(f, "%s%d", i ? "," : "", first + i);
		fprintf(f, "): %s\n", vtext[replica_verdict(w, d)]);
		for (const char *m = mechs; *m; m++) {
			size_t nm = 0;
			for (size_t i = 0; i < w->nf; i++) {
				const struct audit_finding *x = &w->f[i];
				if (x->mech != *m || !finding_in(w, x, d))
					continue;
				fprintf(f, "  %c  %s  ranks ", *m, nm++ ? "    " : "FAIL");
				text_ranks(f, x->ranks, x->nranks);
				fprintf(f, "%s%s: %s\n", x->site && x->site[0] ? " at " : "", x->site ? x->site : "", x->detail ? x->detail : "");
				if (x->ntrail)
					text_trail(f, x);
			}
			if (!nm)
				fprintf(f, "  %c  %s\n", *m, vtext[mech_verdict(w, d, *m)]);
		}
	}
	if (w->ngaps) {
		fputc('\n', f);
		text_gaps(f, "  ", w->gaps, w->ngaps);
	}
	fputc('\n', f);
}

static void text_exits(const struct view *v, FILE *f)
{
	bool any = false;
	for (size_t i = 0; i < v->a->nexits; i++) {
		const struct audit_exit *e = &v->a->exits[i];
		char sig[32];
		if (!e->sig && !e->code)
			continue;
		if (!any)
			fputs("workers that did not exit 0 (as dptp-run saw them):\n", f);
		any = true;
		fprintf(f, "  rank %d (pid %d, attempt %d): ", e->rank, (int)e->pid, e->attempt);
		if (e->sig)
			fprintf(f, "killed by %s%s\n", sig_name(e->sig, sig, sizeof(sig)), e->core ? " (core dumped)" : "");
		else
			fprintf(f, "exited with %d\n", e->code);
	}
	if (any)
		fputc('\n', f);
}

static int write_text(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_report *rep = v->rep;
	fprintf(f, "dptp-run --audit: %s: %zu world%s, %d attempt%s%s\n", vtext[v->v], rep->nw, rep->nw == 1 ? "" : "s",
		rep->attempts, rep->attempts == 1 ? "" : "s", rep->nw ? "" : ", nothing was recorded");
	for (size_t i = 0; i < rep->nw; i++)
		text_world(v, &rep->w[i], f);
	if (rep->ngaps) {
		text_gaps(f, "", rep->gaps, rep->ngaps);
		fputc('\n', f);
	}
	text_exits(v, f);
	fprintf(f, "%s: %zu finding%s, %zu gap%s; records %s %s%s\n", vtext[v->v], v->nf, v->nf == 1 ? "" : "s", v->ngaps,
		v->ngaps == 1 ? "" : "s", removed(v->a) ? "were in" : "in", v->a->dir,
		removed(v->a) ? " (removed; --audit-keep keeps them)" : "");
	return ferror(f) ? -EIO : 0;
}

/* ---- JUnit: one suite per world and attempt, one case per replica and
 * mechanism (dp<d>/<M>); a finding is a <failure>, a gap an <error>
 * (incomplete is never a pass); the job's own gaps one more case ---- */

static void xml_str(FILE *f, const char *s)
{
	dptp_xml_escape(f, s, strlen(s));
}

static void junit_case(FILE *f, const struct audit_result *w, int d, char m)
{
	enum verdict vd = mech_verdict(w, d, m);
	fprintf(f, "    <testcase name=\"dp%d/%c\" classname=\"dptp-run --audit.", d, m);
	xml_str(f, w->world_id[0] ? w->world_id : "launcher");
	fprintf(f, ".a%d\"", w->attempt);
	if (vd == V_PASS) {
		fputs("/>\n", f);
		return;
	}
	fputs(">\n", f);
	if (vd == V_FAIL) {
		fputs("      <failure message=\"finding\">", f);
		for (size_t i = 0; i < w->nf; i++)
			if (w->f[i].mech == m && finding_in(w, &w->f[i], d)) {
				xml_str(f, w->f[i].site ? w->f[i].site : "");
				fputs(": ", f);
				xml_str(f, w->f[i].detail ? w->f[i].detail : "");
				fputc('\n', f);
			}
		fputs("</failure>\n", f);
	} else {
		fputs("      <error message=\"incomplete: not everything was recorded\">", f);
		if (w->capped)
			fputs("a recorder reached its record cap\n", f);
		for (size_t i = 0; i < w->ngaps; i++)
			if (gap_in(w, &w->gaps[i], d)) {
				fprintf(f, "rank %d pid %d: ", w->gaps[i].rank, (int)w->gaps[i].pid);
				xml_str(f, w->gaps[i].why);
				fputc('\n', f);
			}
		fputs("</error>\n", f);
	}
	fputs("    </testcase>\n", f);
}

static int write_junit(void *arg, FILE *f)
{
	const struct view *v = arg;
	const struct audit_report *rep = v->rep;
	fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"dptp-run --audit\">\n", f);
	for (size_t i = 0; i < rep->nw; i++) {
		const struct audit_result *w = &rep->w[i];
		struct dptp_layout l = shown(w);
		int nfail = 0, nerr = 0;
		for (int d = 0; d < l.dp; d++)
			for (const char *m = mechs; *m; m++) {
				enum verdict x = mech_verdict(w, d, *m);
				nfail += x == V_FAIL;
				nerr += x == V_INCOMPLETE;
			}
		fputs("  <testsuite name=\"", f);
		xml_str(f, w->world_id[0] ? w->world_id : "launcher");
		fprintf(f, " attempt %d\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"0\">\n", w->attempt,
			l.dp * (int)(sizeof(mechs) - 1), nfail, nerr);
		fprintf(f, "    <properties>\n      <property name=\"layout\" value=\"world=%d dp=%d pp=%d tp=%d\"/>\n    </properties>\n",
			w->world, l.dp, l.pp, l.tp);
		for (int d = 0; d < l.dp; d++)
			for (const char *m = mechs; *m; m++)
				junit_case(f, w, d, *m);
		fputs("  </testsuite>\n", f);
	}
	if (rep->ngaps || !rep->nw) {
		fputs("  <testsuite name=\"job\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n"
		      "    <testcase name=\"records\" classname=\"dptp-run --audit.job\">\n"
		      "      <error message=\"incomplete: not everything was recorded\">", f);
		if (!rep->nw)
			fputs("nothing was recorded\n", f);
		for (size_t i = 0; i < rep->ngaps; i++) {
			fprintf(f, "rank %d pid %d attempt %d: ", rep->gaps[i].rank, (int)rep->gaps[i].pid, rep->gaps[i].attempt);
			xml_str(f, rep->gaps[i].why);
			fputc('\n', f);
		}
		fputs("</error>\n    </testcase>\n  </testsuite>\n", f);
	}
	fputs("</testsuites>\n", f);
	return ferror(f) ? -EIO : 0;
}

int audit_finish(struct audit *a, int job_status, FILE *errs)
{
	struct audit_report rep;
	struct dptp_err err = {0};
	int status = job_status;
	if (!a)
		return job_status;
	stop_watch(a);
	if (!a->dir[0]) /* the job never started workers */
		return job_status;
	memset(&rep, 0, sizeof(rep));
	int hung = a->nhangs ? a->hung_attempt : -1;
	int rc = audit_analyze_job(a->dir, a->have_layout ? &a->layout : NULL, hung, &rep, &err);
	if (rc < 0) {
		fprintf(errs, "dptp-run --audit: error: %s (records in %s)\n", err.msg, a->dir);
		audit_report_release(&rep);
		a->keep = true; /* what could not be read stays to be looked at */
		return job_status ? job_status : 1;
	}
	struct view v = {.a = a, .rep = &rep, .job_status = job_status, .hung_attempt = hung};
	view_init(&v);
	fputc('\n', errs);
	write_text(&v, errs);
	fflush(errs);
	if (a->output || a->format_given) {
		int (*emit)(void *, FILE *) = a->format == DPTP_FORMAT_TEXT ? write_text
					     : a->format == DPTP_FORMAT_JUNIT ? write_junit : write_json;
		if (!a->output || to_stdout(a->output)) { /* --audit-format alone: stdout */
			fflush(stdout);
			if (emit(&v, stdout) < 0 || fflush(stdout) != 0) {
				fprintf(errs, "dptp-run --audit: error: cannot write the report to stdout: %s\n", strerror(errno));
				if (!status)
					status = 1;
			}
		} else if (dptp_write_file_with(a->output, emit, &v, &err) < 0) {
			fprintf(errs, "dptp-run --audit: error: %s\n", err.msg);
			if (!status)
				status = 1;
		}
	}
	if (!status)
		status = v.v == V_FAIL ? 1 : v.v == V_INCOMPLETE ? 5 : 0;
	audit_report_release(&rep);
	return status;
}

void audit_abandon(struct audit *a)
{
	if (!a)
		return;
	stop_watch(a);
	if (removed(a))
		dptp_rm_tree(a->own_dir);
	free(a->own_dir);
	a->own_dir = NULL;
	a->dir[0] = '\0';
}

void audit_destroy(struct audit *a)
{
	if (!a)
		return;
	stop_watch(a);
	pthread_mutex_destroy(&a->mu);
	pthread_cond_destroy(&a->cv);
	if (a->lfd >= 0)
		close(a->lfd);
	if (removed(a))
		dptp_rm_tree(a->own_dir);
	free(a->own_dir);
	free(a->slots);
	free(a->files);
	free(a->exits);
	free(a);
}
