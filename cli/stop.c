/* dptp-check's last words: the report of a run a signal ends, or that never
 * started (stop.h). */
#include "stop.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/layout.h"
#include "checks/check.h"
#include "dptp-config.h"
#include "report/gather.h"
#include "sweep.h"

enum phase { PH_BOOT, PH_STARTUP, PH_CHECKS, PH_GATHER, PH_SWEEP, PH_BENCH };

/* The one piece of process-wide state dptp-check has: a signal handler
 * reaches nothing else. Everything but the pipe is read and written under
 * `lock`. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int pipe[2];
	const struct dptp_options *o;
	bool cuda;
	struct dptp_bootstrap *b;     /* NULL: not booted, the rank unknown */
	enum phase phase;
	const struct dptp_check_result *res;
	size_t ndone;
	const char *current;
	size_t base; /* --layouts: results of the layouts before res */
	dptp_stop_sweep_writer sweep_writer;
	void *sweep_arg;
	bool claimed; /* by main (done tells when it is through) or by a signal */
	bool done;
	int code;
} S = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
	.pipe = { -1, -1 },
};

static const int handled[] = { SIGTERM, SIGINT, SIGHUP };

static const char *sig_name(int sig)
{
	switch (sig) {
	case SIGTERM: return "SIGTERM";
	case SIGINT: return "SIGINT";
	case SIGHUP: return "SIGHUP";
	}
	return "?";
}

/* The rank the environment names, as the bootstrap would read it; -1 when
 * none (or not a number). */
static int env_rank(void)
{
	const char *pmix = getenv("PMIX_NAMESPACE");
	const char *names[] = { pmix && *pmix ? "PMIX_RANK" : "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID" };
	for (size_t i = 0; i < DPTP_ARRAY_LEN(names); i++) {
		const char *v = getenv(names[i]);
		uint64_t r;
		if (v && *v && dptp_parse_u64(v, 0, INT32_MAX, false, &r) == 0)
			return (int)r;
	}
	return -1;
}

bool dptp_stop_maybe_rank0(void)
{
	return env_rank() <= 0;
}

/* ---- the report of checks that did not run ---- */

struct plan {
	int world, dp, pp, tp;
	size_t nsel;
	const char *names[DPTP_MAX_CHECKS];
};

static void plan_init(struct plan *p, const struct dptp_options *o, int world, bool bench)
{
	memset(p, 0, sizeof(*p));
	if (bench) {
		p->names[p->nsel++] = "bench";
	} else {
		for (int i = 0; i < dptp_nchecks && p->nsel < DPTP_MAX_CHECKS; i++)
			if (o->checks & (1u << i))
				p->names[p->nsel++] = dptp_checks[i]->name;
	}
	struct dptp_layout l;
	struct dptp_err e = {0};
	if (world <= 0) {
		p->world = p->dp = p->pp = p->tp = 1; /* a single-process report */
	} else if (!o->layouts && dptp_layout_init(&l, world, o->dp, o->pp, o->tp, &e) == 0) {
		p->world = world;
		p->dp = l.dp;
		p->pp = l.pp;
		p->tp = l.tp;
	} else {
		/* no layout of o's fits (or several, --layouts): one replica
		 * of every rank */
		p->world = p->tp = world;
		p->dp = p->pp = 1;
	}
}

/* Fills rep's replicas from p: every (replica, check) is st with why. */
static int plan_build(const struct plan *p, struct dptp_report *rep, enum dptp_status st, const char *why)
{
	rep->world = p->world;
	rep->dp = p->dp;
	rep->pp = p->pp;
	rep->tp = p->tp;
	rep->replicas = calloc((size_t)p->dp, sizeof(*rep->replicas));
	if (!rep->replicas)
		return -ENOMEM;
	rep->nreplicas = (size_t)p->dp;
	int per = p->world / p->dp;
	for (int d = 0; d < p->dp; d++) {
		struct dptp_replica_result *r = &rep->replicas[d];
		r->dp = d;
		r->status = st;
		r->ranks = calloc((size_t)per, sizeof(int));
		r->checks = calloc(p->nsel ? p->nsel : 1, sizeof(*r->checks));
		if (!r->ranks || !r->checks)
			return -ENOMEM;
		r->nranks = per;
		for (int i = 0; i < per; i++)
			r->ranks[i] = d * per + i; /* as dptp_results_merge lays them out */
		r->nchecks = p->nsel;
		for (size_t k = 0; k < p->nsel; k++) {
			snprintf(r->checks[k].name, sizeof(r->checks[k].name), "%s", p->names[k]);
			dptp_result_set(&r->checks[k], st, "%s", why);
			if (!r->checks[k].detail)
				return -ENOMEM;
		}
	}
	return 0;
}

static void report_head(struct dptp_report *rep, const struct dptp_options *o, const struct dptp_bootstrap *b,
			bool cuda, const char **inject)
{
	const char *pmix = getenv("PMIX_NAMESPACE");
	*rep = (struct dptp_report){
		.tool = "dptp-check", .version = DPTP_VERSION,
		.backend = cuda ? "cuda" : "host", .seed = o->seed, .inject = inject,
		/* without a bootstrap: the one the environment asked for */
		.bootstrap = b ? b->ops->name : pmix && *pmix ? "pmix" : getenv("RANK") ? "torchrun" : "single",
		.engine = b ? b->engine : NULL,
	};
	for (int f = 0; f < DPTP_NFAULTS; f++)
		if (dptp_fault_on(o->inject, f))
			inject[rep->ninject++] = dptp_faults[f].name;
}

int dptp_stop_report_not_run(const struct dptp_options *o, const struct dptp_bootstrap *b, int world,
			     bool cuda, enum dptp_status st, const char *why, int code,
			     struct dptp_bench_row *rows, size_t nrows)
{
	const char *inject[DPTP_NFAULTS];
	struct dptp_report rep;
	struct plan p;
	report_head(&rep, o, b, cuda, inject);
	rep.bench = rows;
	rep.nbench = nrows;
	plan_init(&p, o, world, o->bench);
	if (plan_build(&p, &rep, st, why) < 0) {
		fprintf(stderr, "dptp-check: out of memory writing the report\n");
		code = EXIT_ENV;
	} else {
		dptp_cli_fill_mech(&rep);
		code = dptp_cli_write_report(o, &rep, code, dptp_use_colour(STDOUT_FILENO));
	}
	dptp_report_release(&rep);
	return code;
}

/* ---- the signal's report ---- */

/* Under S.lock: what the main thread was doing, for the details. */
static void phase_words(char *buf, size_t n)
{
	switch (S.phase) {
	case PH_BOOT: snprintf(buf, n, "while connecting to the launcher"); break;
	case PH_STARTUP: snprintf(buf, n, "before the checks began"); break;
	case PH_CHECKS:
		if (S.current)
			snprintf(buf, n, "during check %s", S.current);
		else
			snprintf(buf, n, "between checks");
		break;
	case PH_GATHER: snprintf(buf, n, "while gathering the results"); break;
	case PH_SWEEP: snprintf(buf, n, "while regrouping for the next layout"); break;
	case PH_BENCH: snprintf(buf, n, "during --bench"); break;
	}
}

static bool over_pmix(void)
{
	return S.b && S.b->size > 1 && strcmp(S.b->ops->name, "pmix") == 0;
}

/* ---- who had arrived, for a signal during the start-up ---- */

#define PROBE_MAX 256

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int pending;
	signed char state[PROBE_MAX]; /* 1 arrived, 0 never did, -1 unknown */
	int rank[PROBE_MAX];
} P = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void *probe_one(void *arg)
{
	int q = *(const int *)arg;
	void *v = NULL;
	size_t vl = 0;
	int rc = dptp_fetch_published(S.b, q, "dptp.arrived", dptp_now() + 0.3, &v, &vl, NULL);
	free(v);
	pthread_mutex_lock(&P.lock);
	P.state[q] = rc == 0 ? 1 : rc == -ENOENT || rc == -ETIMEDOUT ? 0 : -1;
	P.pending--;
	pthread_cond_signal(&P.cond);
	pthread_mutex_unlock(&P.lock);
	return NULL;
}

/* Under S.lock, over PMIx: asks every peer's arrival mark (dptp_stop_booted
 * publishes it), all at once, 0.5 s at most. Writes "1 of 4 ranks never
 * arrived: 2" (or that every rank had) to buf; "" when the server cannot
 * tell (it let go of this client) or the world is too large to ask. */
static void probe_arrivals(char *buf, size_t n)
{
	buf[0] = 0;
	int world = S.b->size;
	if (world > PROBE_MAX)
		return;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 << 10);
	pthread_mutex_lock(&P.lock);
	for (int q = 1; q < world; q++) {
		pthread_t t;
		P.state[q] = -1;
		P.rank[q] = q;
		if (pthread_create(&t, &a, probe_one, &P.rank[q]) == 0)
			P.pending++;
	}
	pthread_attr_destroy(&a);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts); /* the condition's clock */
	ts.tv_nsec += 500000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (P.pending > 0 && pthread_cond_timedwait(&P.cond, &P.lock, &ts) != ETIMEDOUT)
		;
	int missing = 0, unknown = 0;
	char list[256] = "";
	size_t off = 0;
	for (int q = 1; q < world; q++) {
		if (P.state[q] < 0)
			unknown++;
		else if (P.state[q] == 0 && ++missing <= 16 && off < sizeof(list))
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", missing > 1 ? ", " : "", q);
	}
	pthread_mutex_unlock(&P.lock); /* a late prober writes P alone */
	if (unknown)
		return;
	if (missing)
		snprintf(buf, n, "; %d of %d ranks never arrived: %s%s", missing, world, list, missing > 16 ? " ..." : "");
	else
		snprintf(buf, n, "; every rank had arrived");
}

/* Fills rep (its head set) with plan p's replicas: every check not run
 * (`why`), but res[0..ndone), this rank's finished results, and the one
 * after them when `running`. */
static int fill_signal(struct dptp_report *rep, const struct plan *p, int sig, const char *when, const char *why,
		       const struct dptp_check_result *res, size_t ndone, bool running)
{
	int rc = plan_build(p, rep, DPTP_ERROR, why);
	/* the checks this rank finished: its own results; the other ranks'
	 * were never gathered */
	int per = p->world / p->dp;
	for (size_t k = 0; rc == 0 && res && k < ndone && k < p->nsel; k++)
		for (int d = 0; rc == 0 && d < p->dp; d++) {
			const struct dptp_check_result *mine = &res[k];
			struct dptp_check_result *c = &rep->replicas[d].checks[k];
			if (d == 0 && per == 1)
				dptp_result_set(c, mine->status, "%s", mine->detail ? mine->detail : "");
			else if (d == 0)
				dptp_result_set(c, mine->status == DPTP_SKIP ? DPTP_SKIP : DPTP_ERROR,
						"rank 0: %s%s%s; the other ranks' results were not gathered: "
						"terminated by signal %d (%s) %s",
						dptp_status_name(mine->status), mine->detail && *mine->detail ? ": " : "",
						mine->detail ? mine->detail : "", sig, sig_name(sig), when);
			else
				dptp_result_set(c, DPTP_ERROR, "not gathered: terminated by signal %d (%s) %s", sig,
						sig_name(sig), when);
			c->seconds = d == 0 ? mine->seconds : 0;
			if (!c->detail)
				rc = -ENOMEM;
		}
	for (size_t d = 0; rc == 0 && running && ndone < p->nsel && d < rep->nreplicas; d++) {
		struct dptp_check_result *c = &rep->replicas[d].checks[ndone];
		dptp_result_set(c, DPTP_ERROR, "terminated by signal %d (%s) during this check", sig, sig_name(sig));
		if (!c->detail)
			rc = -ENOMEM;
	}
	for (size_t d = 0; rc == 0 && d < rep->nreplicas; d++) {
		struct dptp_replica_result *r = &rep->replicas[d];
		for (size_t k = 0; k < r->nchecks; k++)
			r->status = k ? dptp_status_worst(r->status, r->checks[k].status) : r->checks[k].status;
	}
	if (rc == 0)
		dptp_cli_fill_mech(rep);
	return rc;
}

static void signal_why(char *buf, size_t n, int sig, const char *when, const char *arrived, bool startup)
{
	snprintf(buf, n, "%sterminated by signal %d (%s) %s%s%s", startup ? "start-up: " : "not run: ", sig,
		 sig_name(sig), when, arrived,
		 sig == SIGTERM ? "; a launcher sends it to every worker when one of them dies or the job is stopped"
				: "");
}

int dptp_stop_fill_layout(struct dptp_report *rep, const struct dptp_options *o, int world, const int lay[3],
			  int sig, const char *when, const struct dptp_check_result *res, size_t ndone, bool running)
{
	struct plan p;
	char why[512];
	plan_init(&p, o, world, false);
	p.dp = lay[0];
	p.pp = lay[1];
	p.tp = lay[2];
	signal_why(why, sizeof(why), sig, when, "", false);
	return fill_signal(rep, &p, sig, when, why, res, ndone, running);
}

/* Under S.lock, on rank 0 (or a rank that may be): writes the report of a
 * run ended by sig; returns the exit code. */
static int signal_report(int sig)
{
	const struct dptp_options *o = S.o;
	char when[128], why[512];
	phase_words(when, sizeof(when));
	if (S.sweep_writer) /* --layouts: its own report */
		return S.sweep_writer(S.sweep_arg, sig, when, S.base + (S.res ? S.ndone : 0), S.current != NULL);
	char arrived[320] = "";
	if (S.phase == PH_STARTUP && over_pmix())
		probe_arrivals(arrived, sizeof(arrived));
	signal_why(why, sizeof(why), sig, when, arrived, S.phase <= PH_STARTUP);
	const char *inject[DPTP_NFAULTS];
	struct dptp_report rep;
	struct plan p;
	report_head(&rep, o, S.b, S.cuda, inject);
	plan_init(&p, o, S.b ? S.b->size : 0, o->bench);
	int code = EXIT_ENV;
	if (fill_signal(&rep, &p, sig, when, why, S.res, S.ndone, S.current != NULL) < 0)
		fprintf(stderr, "dptp-check: out of memory writing the report\n");
	else
		code = dptp_cli_write_report(o, &rep, EXIT_ENV, false);
	dptp_report_release(&rep);
	return code;
}

/* A PMIx call made on the way out, in a thread of its own: a client whose
 * server has let go of it (dptp-run does so before it signals the workers)
 * may wait on it for ever. */
struct bounded {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	bool publish; /* else fetch */
	int32_t code;
};

static void *bounded_call(void *arg)
{
	struct bounded *c = arg;
	int32_t code = c->code;
	if (c->publish) {
		dptp_bootstrap_publish(S.b, "dptp.verdict", &code, sizeof(code), NULL);
	} else {
		/* a server that has let go of this client refuses a commit at
		 * once (UNREACHABLE): then nobody is served, rank 0 neither */
		void *v = NULL;
		size_t vl = 0;
		if (dptp_bootstrap_publish(S.b, "dptp.leaving", &code, sizeof(code), NULL) == 0 &&
		    dptp_fetch_published(S.b, 0, "dptp.verdict", dptp_now() + 10, &v, &vl, NULL) == 0 &&
		    vl == sizeof(code))
			memcpy(&code, v, sizeof(code));
		free(v);
	}
	pthread_mutex_lock(&c->lock);
	c->code = code;
	c->done = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	return NULL; /* c is never freed: the process is about to end */
}

/* Runs the publish (of code) or the fetch of rank 0's verdict for `wait`
 * seconds at most; returns the verdict fetched, else code. */
static int32_t bounded_verdict(bool publish, int32_t code, double wait)
{
	static struct bounded c = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	c.publish = publish;
	c.code = code;
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&t, &a, bounded_call, &c);
	pthread_attr_destroy(&a);
	if (rc != 0)
		return code;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts); /* the condition's clock */
	double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + wait;
	ts.tv_sec = (time_t)end;
	ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
	pthread_mutex_lock(&c.lock);
	while (!c.done && pthread_cond_timedwait(&c.cond, &c.lock, &ts) != ETIMEDOUT)
		;
	int32_t got = c.done ? c.code : code;
	pthread_mutex_unlock(&c.lock);
	return got;
}

/* Under S.lock, on a rank other than 0: Open MPI's mpirun SIGKILLs the
 * rest of a job as soon as a second process has left after its SIGTERM, so
 * rank 0 would be killed while writing. Over PMIx a rank leaves once rank 0
 * has published its verdict, 1 s at most (at once when the server has let
 * go of the workers: dptp-run does before it signals them). dptp-run, like
 * torchrun, waits for every worker and kills none for leaving early, so
 * under it no rank waits (the wait cost up to 1 s there: the fetch did not
 * always fail at once after the release). The torchrun store's client is
 * the main thread's alone, and torchrun waits for its workers: no wait.
 * Returns the exit code. */
static int wait_for_rank0(void)
{
	bool dptp_run = S.b && strcmp(S.b->engine, "dptp-run") == 0;
	return over_pmix() && !dptp_run ? bounded_verdict(false, EXIT_ENV, 1.0) : EXIT_ENV;
}

static void last_words(int sig)
{
	pthread_mutex_lock(&S.lock);
	int rank = S.b ? S.b->rank : env_rank();
	if (S.done) /* the report is out: the verdict stands */
		_exit(S.code);
	if (rank > 0 || (!S.b && !S.o->output)) {
		/* not rank 0 (or not known to be, with nothing to write but
		 * stdout, which every rank shares) */
		_exit(rank > 0 ? wait_for_rank0() : EXIT_ENV);
	}
	if (S.claimed) {
		/* the main thread is writing the report: let it finish */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts); /* the condition's clock */
		ts.tv_sec += 10;
		while (!S.done && pthread_cond_timedwait(&S.cond, &S.lock, &ts) != ETIMEDOUT)
			;
		_exit(S.done ? S.code : EXIT_ENV);
	}
	S.claimed = true;
	int code = signal_report(sig);
	if (over_pmix()) /* the others wait for it (wait_for_rank0) */
		(void)bounded_verdict(true, code, 0.5);
	fprintf(stderr, "dptp-check: rank %d: terminated by signal %d (%s)%s%s\n", rank < 0 ? 0 : rank, sig,
		sig_name(sig), S.o->output ? "; report written to " : "", S.o->output ? S.o->output : "");
	_exit(code);
}

static void on_signal(int sig)
{
	int e = errno;
	unsigned char c = (unsigned char)sig;
	ssize_t n = write(S.pipe[1], &c, 1); /* non-blocking: a second signal may find it full */
	(void)n;
	errno = e;
}

static void *watch(void *arg)
{
	(void)arg;
	sigset_t set;
	sigemptyset(&set);
	for (size_t i = 0; i < DPTP_ARRAY_LEN(handled); i++)
		sigaddset(&set, handled[i]);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	unsigned char c;
	ssize_t n;
	while ((n = read(S.pipe[0], &c, 1)) < 0 && errno == EINTR)
		;
	if (n == 1)
		last_words(c);
	return NULL;
}

int dptp_stop_init(const struct dptp_options *o, bool cuda)
{
	S.o = o;
	S.cuda = cuda;
	if (pipe2(S.pipe, O_CLOEXEC) < 0)
		return -errno;
	fcntl(S.pipe[1], F_SETFL, O_NONBLOCK);
	sigset_t set, old;
	sigemptyset(&set);
	for (size_t i = 0; i < DPTP_ARRAY_LEN(handled); i++)
		sigaddset(&set, handled[i]);
	/* blocked here and in every thread created from here on: a signal
	 * goes to the watcher, which alone leaves them open */
	pthread_sigmask(SIG_BLOCK, &set, &old);
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < DPTP_ARRAY_LEN(handled); i++) {
		struct sigaction prev;
		/* a signal ignored by whoever started us stays ignored (nohup) */
		if (sigaction(handled[i], NULL, &prev) == 0 && prev.sa_handler == SIG_IGN)
			continue;
		sigaction(handled[i], &sa, NULL);
	}
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 << 10);
	int rc = pthread_create(&t, &a, watch, NULL);
	pthread_attr_destroy(&a);
	if (rc != 0) {
		/* no watcher: the signals act as they did */
		for (size_t i = 0; i < DPTP_ARRAY_LEN(handled); i++)
			signal(handled[i], SIG_DFL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return -rc;
	}
	return 0;
}

static void set_phase(enum phase ph)
{
	pthread_mutex_lock(&S.lock);
	S.phase = ph;
	pthread_mutex_unlock(&S.lock);
}

void dptp_stop_booted(struct dptp_bootstrap *b)
{
	pthread_mutex_lock(&S.lock);
	S.b = b;
	/* this rank's arrival, for rank 0's report should a signal end the
	 * start-up (probe_arrivals) */
	if (over_pmix() && b->rank > 0)
		dptp_bootstrap_publish(b, "dptp.arrived", "", 1, NULL);
	pthread_mutex_unlock(&S.lock);
}

void dptp_stop_startup(void)
{
	set_phase(PH_STARTUP);
}

void dptp_stop_checks(const struct dptp_check_result *res, size_t ndone, const char *current)
{
	pthread_mutex_lock(&S.lock);
	S.phase = PH_CHECKS;
	S.res = res;
	S.ndone = ndone;
	S.current = current;
	pthread_mutex_unlock(&S.lock);
}

void dptp_stop_gather(void)
{
	set_phase(PH_GATHER);
}

void dptp_stop_sweep(dptp_stop_sweep_writer writer, void *arg)
{
	pthread_mutex_lock(&S.lock);
	S.phase = PH_SWEEP;
	S.sweep_writer = writer;
	S.sweep_arg = arg;
	pthread_mutex_unlock(&S.lock);
}

void dptp_stop_sweep_at(size_t base)
{
	pthread_mutex_lock(&S.lock);
	S.phase = PH_SWEEP;
	S.base = base;
	S.res = NULL;
	S.ndone = 0;
	S.current = NULL;
	pthread_mutex_unlock(&S.lock);
}

void dptp_stop_bench(void)
{
	set_phase(PH_BENCH);
}

bool dptp_stop_claim(void)
{
	pthread_mutex_lock(&S.lock);
	bool mine = !S.claimed;
	S.claimed = true;
	pthread_mutex_unlock(&S.lock);
	if (!mine) {
		/* a signal's report is being written; the process ends with it */
		for (int i = 0; i < 100; i++)
			usleep(100000);
	}
	return mine;
}

void dptp_stop_done(int code)
{
	pthread_mutex_lock(&S.lock);
	S.claimed = true;
	S.done = true;
	S.code = code;
	S.res = NULL;
	pthread_cond_broadcast(&S.cond);
	pthread_mutex_unlock(&S.lock);
}
