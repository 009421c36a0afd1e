/* The job's restart and teardown decisions (launcher/agent/supervise.c),
 * through supervise_run with its surroundings faked by -Wl,--wrap: the
 * rendezvous (one node, n ranks), the PMIx server (up, every call
 * recorded), the worker start (spawn_worker hands out made-up pids), the
 * guard (none), and the kernel's side of the workers: killpg records each
 * signal and decides, per the test's script, whether the worker dies of
 * it; waitpid(-1, WNOHANG) reports the scripted exits and those deaths.
 * The failure report is captured (failure_report_write wrapped).
 *
 * What is checked: a worker failure with restarts left starts a new
 * attempt (a new rendezvous round, a new nspace, every worker again); with
 * none left the job ends 1: its surviving worker gets SIGTERM, then, not
 * before the grace period, SIGKILL, and the report's root cause is the
 * first failure; a PMIx client that exits 0 without PMIx_Finalize is a
 * failure, one that finalized is not; a death signal to the launcher
 * stops the workers with that signal and ends the job without a restart;
 * SIGUSR1 goes to the workers and the job goes on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/guard.h"
#include "agent/spawn.h"
#include "agent/supervise.h"
#include "base/util.h"
#include "output/failure.h"
#include "pmix/pmix_srv.h"
#include "rdzv/rendezvous.h"

/* --- the script: how each worker of each attempt behaves --- */

struct behaviour {
	int exit_after; /* exits by itself at this waitpid call after its start (-1: never) */
	int code;       /* with this exit code */
	bool ignore_term; /* SIGTERM does not end it (SIGKILL does) */
};
static struct behaviour (*script)(unsigned attempt, unsigned local_rank);
/* a signal the launcher receives at this waitpid call (0: none) */
static int signal_at_call, signal_to_send;
static enum pmix_srv_client client_state = PMIX_SRV_CLIENT_NONE;

enum { MAX_W = 16, MAX_SIG = 64 };
struct fake_worker {
	pid_t pid;
	unsigned attempt, local_rank;
	struct behaviour b;
	long started_at; /* waitpid calls then */
	bool dead, reaped;
	int status;
	double reaped_at; /* when waitpid reported it */
};
static struct fake_worker fw[MAX_W];
static unsigned nfw, nattempt, nspawn_in_attempt;
static long nwait;
static struct {
	pid_t pgrp;
	int sig;
	double at;
	bool alive; /* the worker was alive when it was sent */
} sigs[MAX_SIG];
static unsigned nsig;
static unsigned rdzv_rounds[8], nrounds;
static unsigned nregister, nderegister;
static char nspaces[8][64];
static char *report;
static size_t nreports, report_n, report_root;
static struct failure root;

static void reset(void)
{
	memset(fw, 0, sizeof(fw));
	nfw = nattempt = nspawn_in_attempt = 0;
	nwait = 0;
	nsig = 0;
	nrounds = 0;
	nregister = nderegister = 0;
	free(report);
	report = NULL;
	nreports = report_n = report_root = 0;
	memset(&root, 0, sizeof(root));
	client_state = PMIX_SRV_CLIENT_NONE;
	signal_at_call = signal_to_send = 0;
}

static struct fake_worker *find(pid_t pid)
{
	for (unsigned i = 0; i < nfw; i++)
		if (fw[i].pid == pid)
			return &fw[i];
	return NULL;
}

/* --- the rendezvous: one node of o->nproc ranks --- */

static int fake_next(struct rendezvous *r, unsigned restart_count, struct rdzv_info *out, struct dptp_err *err)
{
	(void)err;
	if (nrounds < DPTP_ARRAY_LEN(rdzv_rounds))
		rdzv_rounds[nrounds++] = restart_count;
	memset(out, 0, sizeof(*out));
	out->group_world_size = 1;
	out->global_world_size = out->role_world_size = r->opts->nproc;
	snprintf(out->master_addr, sizeof(out->master_addr), "127.0.0.1");
	out->master_port = 29500;
	snprintf(out->run_id, sizeof(out->run_id), "test");
	snprintf(out->nspace, sizeof(out->nspace), "fake-%u", restart_count);
	nattempt = restart_count;
	nspawn_in_attempt = 0;
	return 0;
}

static void fake_shutdown(struct rendezvous *r)
{
	(void)r;
}

static const struct rendezvous_ops fake_ops = {.next = fake_next, .shutdown = fake_shutdown};

int __wrap_rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err);
int __wrap_rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err)
{
	(void)err;
	memset(r, 0, sizeof(*r));
	r->ops = &fake_ops;
	r->opts = o;
	r->abort_fd = -1;
	snprintf(r->run_id, sizeof(r->run_id), "test");
	return 0;
}

/* --- the workers --- */

int __wrap_spawn_worker(const struct spawn_req *r, pid_t *pid_out);
int __wrap_spawn_worker(const struct spawn_req *r, pid_t *pid_out)
{
	(void)r;
	assert_true(nfw < MAX_W);
	struct fake_worker *w = &fw[nfw];
	w->pid = 4000000 + (pid_t)nfw; /* never a real process: killpg and waitpid are fakes */
	w->attempt = nattempt;
	w->local_rank = nspawn_in_attempt++;
	w->b = script(w->attempt, w->local_rank);
	w->started_at = nwait;
	nfw++;
	*pid_out = w->pid;
	return 0;
}

int __wrap_killpg(pid_t pgrp, int sig);
int __wrap_killpg(pid_t pgrp, int sig)
{
	struct fake_worker *w = find(pgrp);
	if (nsig < MAX_SIG)
		sigs[nsig++] = (typeof(sigs[0])){.pgrp = pgrp, .sig = sig, .at = dptp_now(), .alive = w && !w->dead};
	if (!w || w->dead)
		return 0;
	if (sig == SIGKILL || (sig == SIGTERM && !w->b.ignore_term)) {
		w->dead = true;
		w->status = sig; /* W_EXITCODE(0, sig): killed by sig */
	}
	return 0;
}

pid_t __real_waitpid(pid_t pid, int *st, int flags);
pid_t __wrap_waitpid(pid_t pid, int *st, int flags);
pid_t __wrap_waitpid(pid_t pid, int *st, int flags)
{
	if (pid != -1 || !(flags & WNOHANG))
		return __real_waitpid(pid, st, flags);
	nwait++;
	if (signal_at_call && nwait == signal_at_call)
		kill(getpid(), signal_to_send); /* blocked: it waits in supervise's signalfd */
	for (unsigned i = 0; i < nfw; i++) {
		struct fake_worker *w = &fw[i];
		if (w->reaped)
			continue;
		if (!w->dead && w->b.exit_after >= 0 && nwait - w->started_at >= w->b.exit_after) {
			w->dead = true;
			w->status = (w->b.code & 0xff) << 8; /* W_EXITCODE(code, 0) */
		}
		if (w->dead) {
			w->reaped = true;
			w->reaped_at = dptp_now();
			*st = w->status;
			return w->pid;
		}
	}
	for (unsigned i = 0; i < nfw; i++)
		if (!fw[i].reaped)
			return 0;
	errno = ECHILD;
	return -1;
}

/* --- no guard process --- */

int __wrap_guard_start(struct guard *g);
int __wrap_guard_start(struct guard *g)
{
	g->pid = 0;
	g->fd = -1;
	return 0;
}

/* --- the PMIx server: up, and answering as told --- */

int __wrap_pmix_srv_init(struct pmix_srv *s, void (*made_dir)(void *ctx, const char *dir), void *ctx,
	struct dptp_err *err);
int __wrap_pmix_srv_init(struct pmix_srv *s, void (*made_dir)(void *ctx, const char *dir), void *ctx,
	struct dptp_err *err)
{
	(void)made_dir;
	(void)ctx;
	(void)err;
	memset(s, 0, sizeof(*s));
	s->up = true;
	return 0;
}

int __wrap_pmix_srv_register_job(struct pmix_srv *s, const char *nspace, unsigned nlocal, unsigned base_rank,
	unsigned world, const char *hostname, uid_t uid, gid_t gid, const struct rdzv_node *nodes, unsigned nnodes,
	unsigned my_node, struct dptp_err *err);
int __wrap_pmix_srv_register_job(struct pmix_srv *s, const char *nspace, unsigned nlocal, unsigned base_rank,
	unsigned world, const char *hostname, uid_t uid, gid_t gid, const struct rdzv_node *nodes, unsigned nnodes,
	unsigned my_node, struct dptp_err *err)
{
	(void)s, (void)hostname, (void)uid, (void)gid, (void)nodes, (void)nnodes, (void)my_node, (void)err;
	assert_int_equal(base_rank, 0);
	assert_int_equal(world, nlocal);
	if (nregister < 8)
		snprintf(nspaces[nregister], sizeof(nspaces[0]), "%s", nspace);
	nregister++;
	return 0;
}

void __wrap_pmix_srv_deregister_job(struct pmix_srv *s);
void __wrap_pmix_srv_deregister_job(struct pmix_srv *s)
{
	(void)s;
	nderegister++;
}

enum pmix_srv_client __wrap_pmix_srv_client_state(const struct pmix_srv *s, unsigned rank);
enum pmix_srv_client __wrap_pmix_srv_client_state(const struct pmix_srv *s, unsigned rank)
{
	(void)s, (void)rank;
	return client_state;
}

int __wrap_pmix_srv_setup_fork(struct pmix_srv *s, unsigned rank, char ***env, struct dptp_err *err);
int __wrap_pmix_srv_setup_fork(struct pmix_srv *s, unsigned rank, char ***env, struct dptp_err *err)
{
	(void)s, (void)rank, (void)env, (void)err;
	return 0;
}

void __wrap_pmix_srv_release_client(struct pmix_srv *s, unsigned rank);
void __wrap_pmix_srv_release_client(struct pmix_srv *s, unsigned rank)
{
	(void)s, (void)rank;
}

int __wrap_pmix_srv_wait_released(struct pmix_srv *s, double timeout, struct dptp_err *err);
int __wrap_pmix_srv_wait_released(struct pmix_srv *s, double timeout, struct dptp_err *err)
{
	(void)s, (void)timeout, (void)err;
	return 0;
}

void __wrap_pmix_srv_worker_started(struct pmix_srv *s, unsigned rank, pid_t pid, const char *exe);
void __wrap_pmix_srv_worker_started(struct pmix_srv *s, unsigned rank, pid_t pid, const char *exe)
{
	(void)s, (void)rank, (void)pid, (void)exe;
}

void __wrap_pmix_srv_worker_exited(struct pmix_srv *s, unsigned rank, int exitcode);
void __wrap_pmix_srv_worker_exited(struct pmix_srv *s, unsigned rank, int exitcode)
{
	(void)s, (void)rank, (void)exitcode;
}

int __wrap_pmix_srv_fd(const struct pmix_srv *s);
int __wrap_pmix_srv_fd(const struct pmix_srv *s)
{
	(void)s;
	return -1; /* poll skips it */
}

bool __wrap_pmix_srv_pending(const struct pmix_srv *s);
bool __wrap_pmix_srv_pending(const struct pmix_srv *s)
{
	(void)s;
	return false;
}

void __wrap_pmix_srv_dispatch(struct pmix_srv *s, const struct pmix_srv_sink *sink);
void __wrap_pmix_srv_dispatch(struct pmix_srv *s, const struct pmix_srv_sink *sink)
{
	(void)s, (void)sink;
}

void __wrap_pmix_srv_finalize(struct pmix_srv *s);
void __wrap_pmix_srv_finalize(struct pmix_srv *s)
{
	(void)s;
}

void __wrap_pmix_srv_abandon(struct pmix_srv *s);
void __wrap_pmix_srv_abandon(struct pmix_srv *s)
{
	(void)s;
}

/* --- the report --- */

void __real_failure_report_write(FILE *out, const char *name, const struct failure *f, size_t n, const char *host);
void __wrap_failure_report_write(FILE *out, const char *name, const struct failure *f, size_t n, const char *host);
void __wrap_failure_report_write(FILE *out, const char *name, const struct failure *f, size_t n, const char *host)
{
	size_t len = 0;
	FILE *m;
	free(report);
	report = NULL;
	m = open_memstream(&report, &len);
	assert_non_null(m);
	__real_failure_report_write(m, name, f, n, host);
	fclose(m);
	fputs(report, out);
	nreports++;
	report_n = n;
	report_root = failure_root(f, n);
	root = f[report_root];
	root.error_file = root.message = NULL; /* borrowed: freed by the job */
}

/* --- running a job --- */

static int run(unsigned nproc, unsigned max_restarts, const char *grace)
{
	char np[32], mr[32];
	char *argv[] = {"dptp-run", np, mr, "--monitor-interval=0.001", "--log-dir=/dev/null", "--no-python",
		"/bin/true", NULL};
	struct run_opts o;
	snprintf(np, sizeof(np), "--nproc-per-node=%u", nproc);
	snprintf(mr, sizeof(mr), "--max-restarts=%u", max_restarts);
	setenv("DPTP_RUN_STOP_TIMEOUT", grace, 1);
	unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
	unsetenv("TORCHELASTIC_ERROR_FILE");
	unsetenv("LOGLEVEL");
	FILE *sink = fopen("/dev/null", "w");
	assert_non_null(sink);
	assert_int_equal(run_opts_parse(&o, (int)DPTP_ARRAY_LEN(argv) - 1, argv, sink, sink), RUN_OPTS_OK);
	fclose(sink);
	int status = supervise_run(&o);
	run_opts_release(&o);
	return status;
}

/* the index in sigs of the first signal sig sent to pgrp while it lived, or -1 */
static int sent(pid_t pgrp, int sig)
{
	for (unsigned i = 0; i < nsig; i++)
		if (sigs[i].pgrp == pgrp && sigs[i].sig == sig && sigs[i].alive)
			return (int)i;
	return -1;
}

/* attempt 0: local rank 1 exits 3 at once, rank 0 runs until signalled
 * (and, with stubborn, ignores SIGTERM); later attempts succeed */
static bool stubborn;
static struct behaviour fail_once(unsigned attempt, unsigned lr)
{
	if (attempt > 0)
		return (struct behaviour){.exit_after = 1, .code = 0};
	if (lr == 1)
		return (struct behaviour){.exit_after = 1, .code = 3};
	return (struct behaviour){.exit_after = -1, .ignore_term = stubborn};
}

static struct behaviour always_fail(unsigned attempt, unsigned lr)
{
	(void)attempt;
	return lr == 1 ? (struct behaviour){.exit_after = 1, .code = 3} : (struct behaviour){.exit_after = -1};
}

static struct behaviour exit0(unsigned attempt, unsigned lr)
{
	(void)attempt, (void)lr;
	return (struct behaviour){.exit_after = 1, .code = 0};
}

static void test_restart_when_restarts_left(void **state)
{
	(void)state;
	reset();
	script = fail_once;
	stubborn = false;
	assert_int_equal(run(2, 1, "30"), 0);
	/* two rounds, the second as restart 1, each with its own nspace */
	assert_int_equal(nrounds, 2);
	assert_int_equal(rdzv_rounds[0], 0);
	assert_int_equal(rdzv_rounds[1], 1);
	assert_int_equal(nregister, 2);
	assert_string_not_equal(nspaces[0], nspaces[1]);
	assert_true(nderegister >= 1);
	/* every worker started again */
	assert_int_equal(nfw, 4);
	assert_int_equal(fw[2].attempt, 1);
	assert_int_equal(fw[3].attempt, 1);
	/* the failed attempt's survivor was stopped with SIGTERM, no SIGKILL
	 * needed: it obeyed */
	assert_true(sent(fw[0].pid, SIGTERM) >= 0);
	assert_int_equal(sent(fw[0].pid, SIGKILL), -1);
	assert_int_equal(nreports, 0);
}

static void test_teardown_when_none_left(void **state)
{
	(void)state;
	reset();
	script = fail_once;
	stubborn = true;
	assert_int_equal(run(2, 0, "0.2"), 1);
	assert_int_equal(nrounds, 1);
	assert_int_equal(nfw, 2);
	/* SIGTERM (and SIGCONT, for a stopped worker), then SIGKILL once the
	 * grace period is over, to the survivor */
	int term = sent(fw[0].pid, SIGTERM), cont = sent(fw[0].pid, SIGCONT), kill9 = sent(fw[0].pid, SIGKILL);
	assert_true(term >= 0);
	assert_true(cont > term);
	assert_true(kill9 > cont);
	/* the grace period runs from when the failure was seen (the
	 * deadline is set before the SIGTERMs go out) */
	assert_true(sigs[kill9].at - fw[1].reaped_at >= 0.2);
	assert_true(fw[0].reaped && fw[1].reaped);
	/* the report: both failures, the root cause the first one */
	assert_int_equal(nreports, 1);
	assert_int_equal(report_n, 2);
	assert_int_equal(root.local_rank, 1);
	assert_int_equal(root.exitcode, 3);
	const char *rc = strstr(report, "Root Cause (first observed failure):");
	assert_non_null(rc);
	assert_non_null(strstr(rc, "rank      : 1 (local_rank: 1)"));
	assert_non_null(strstr(rc, "exitcode  : 3"));
	assert_non_null(strstr(report, "exitcode  : -9"));
}

static void test_restarts_used_up(void **state)
{
	(void)state;
	reset();
	script = always_fail;
	assert_int_equal(run(2, 2, "30"), 1);
	assert_int_equal(nrounds, 3);
	assert_int_equal(rdzv_rounds[2], 2);
	assert_int_equal(nfw, 6);
	assert_int_equal(nreports, 1);
	assert_int_equal(root.local_rank, 1);
	assert_int_equal(root.exitcode, 3);
}

static void test_exit0_without_finalize_fails(void **state)
{
	(void)state;
	reset();
	script = exit0;
	client_state = PMIX_SRV_CLIENT_INIT; /* PMIx_Init, no PMIx_Finalize */
	assert_int_equal(run(1, 0, "30"), 1);
	assert_int_equal(nreports, 1);
	assert_int_equal(root.local_rank, 0);
	assert_int_equal(root.exitcode, 0);
	assert_non_null(strstr(report, "without calling PMIx_Finalize"));
}

static void test_exit0_after_finalize_succeeds(void **state)
{
	(void)state;
	reset();
	script = exit0;
	client_state = PMIX_SRV_CLIENT_FINALIZED;
	assert_int_equal(run(2, 0, "30"), 0);
	assert_int_equal(nreports, 0);
	client_state = PMIX_SRV_CLIENT_NONE; /* never a PMIx client: torchrun's rule */
	reset();
	script = exit0;
	assert_int_equal(run(2, 0, "30"), 0);
	assert_int_equal(nreports, 0);
}

static struct behaviour run_until_signalled(unsigned attempt, unsigned lr)
{
	(void)lr;
	/* a restart (wrong) would end at once, not hang the test */
	return attempt ? (struct behaviour){.exit_after = 1} : (struct behaviour){.exit_after = -1};
}

static struct behaviour exit0_later(unsigned attempt, unsigned lr)
{
	(void)attempt, (void)lr;
	return (struct behaviour){.exit_after = 20, .code = 0};
}

/* a death signal to the launcher is no worker failure: the workers get
 * that signal, the job ends 1 with restarts left, no failure report */
static void test_death_signal_no_restart(void **state)
{
	(void)state;
	reset();
	script = run_until_signalled;
	signal_at_call = 3;
	signal_to_send = SIGTERM;
	assert_int_equal(run(2, 3, "30"), 1);
	assert_int_equal(nrounds, 1);
	assert_int_equal(nfw, 2);
	assert_true(sent(fw[0].pid, SIGTERM) >= 0);
	assert_true(sent(fw[1].pid, SIGTERM) >= 0);
	assert_int_equal(nreports, 0);
}

/* SIGUSR1 to the launcher goes to every worker's group, as mpirun does,
 * and the job goes on */
static void test_sigusr1_forwarded(void **state)
{
	(void)state;
	reset();
	script = exit0_later;
	signal_at_call = 3;
	signal_to_send = SIGUSR1;
	assert_int_equal(run(2, 0, "30"), 0);
	assert_int_equal(nrounds, 1);
	assert_true(sent(fw[0].pid, SIGUSR1) >= 0);
	assert_true(sent(fw[1].pid, SIGUSR1) >= 0);
	assert_int_equal(sent(fw[0].pid, SIGTERM), -1);
	assert_int_equal(nreports, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_when_restarts_left),
		cmocka_unit_test(test_teardown_when_none_left),
		cmocka_unit_test(test_restarts_used_up),
		cmocka_unit_test(test_exit0_without_finalize_fails),
		cmocka_unit_test(test_exit0_after_finalize_succeeds),
		cmocka_unit_test(test_death_signal_no_restart),
		cmocka_unit_test(test_sigusr1_forwarded),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	free(report);
	return rc;
}
