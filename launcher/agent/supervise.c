/* Worker-group supervision, torchrun's agent in one poll loop (see
 * supervise.h). Every event (SIGCHLD and forwarded signals through a
 * signalfd, PMIx upcalls through the server's pipe, tee'd worker output)
 * arrives on this thread; nothing else touches the job. */
#include "agent/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "audit/audit.h"
#include "agent/env.h"
#include "output/events.h"
#include "agent/guard.h"
#include "log/glog.h"
#include "base/host.h"
#include "output/logs.h"
#include "agent/numa.h"
#include "pmix/pmix_srv.h"
#include "rdzv/rendezvous.h"
#include "output/failure.h"
#include "plane/shm.h"
#include "agent/spawn.h"
#include "pmix/xnode.h"

struct worker {
	unsigned local_rank, global_rank;
	pid_t pid;
	bool alive;
	bool recorded; /* its failure is already in job.fail */
	int exitcode;
	char *error_file;
	struct logs_stream out, err;
};

/* ATT_REGROUP: nodes wait for the next round (c10d): restart the workers
 * without counting it; ATT_RDZV_SIGNAL: a death signal during the
 * rendezvous. */
enum attempt_result { ATT_OK, ATT_FAILED, ATT_SIGNALLED, ATT_ERROR, ATT_REGROUP, ATT_RDZV_SIGNAL };

struct job {
	const struct run_opts *o;
	struct rendezvous rdzv;
	struct rdzv_info info;
	struct pmix_srv srv;
	struct xnode *xn;   /* cross-node fences (several dptp-run nodes) */
	int peer_failed;    /* another node reported a failed attempt: -1 none */
	char lost[400];     /* a lost node (xnode_lost), as reported; "" none */
	bool store_gone;    /* ... or the store (xnode_store_gone): no word to it */
	struct logs_dirs logs;
	struct worker_cmd cmd;
	struct worker *w;
	unsigned n, alive;
	int sigfd;
	int rdzv_sigfd;     /* the death signals only: the rendezvous' abort fd */
	sigset_t forward;   /* signals passed on to the workers (SIGUSR1, SIGUSR2) */
	bool regroup;       /* nodes wait for the next round: workers stopped for it */
	bool tick_failed;   /* a rendezvous tick failed (logged once) */
	bool started_once;  /* workers were started (torch's signal handlers are on) */
	bool warned_mixed;  /* the no-PMIx warning of a mixed job was given */
	char hostname[256];
	unsigned restart_count;
	struct failure *fail;
	size_t nfail;
	bool stopping, killed, exec_failed;
	double deadline;
	int signal_received;
	double stop_timeout;
	double barrier_timeout;   /* the exit barrier's wait, torch's 300 s by default */
	bool info_log;
	struct guard guard;
	struct numa_plan numa; /* --numa-binding: each local rank's CPUs */
	struct logs_filters dup[2]; /* --duplicate-stdout/stderr-filters */
	int dup_fd[2];             /* this attempt's filtered_std{out,err}.log */
	struct agent_events ev;    /* --event-log-handler */
	char last_error[DPTP_ERR_MAX]; /* what ended the run (ATT_ERROR) */
};

__attribute__((format(printf, 2, 3)))
static void logmsg(char level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	glog_vlog(level, fmt, ap);
	va_end(ap);
}

static const char *signame(int sig, char *buf, size_t len)
{
	const char *ab = sigabbrev_np(sig);
	snprintf(buf, len, "SIG%s", ab ? ab : "UNKNOWN");
	return buf;
}

/* DPTP_RUN_TIMING=1: phase timings on stderr, for bench/launch.py */
static double t_start;
static bool timing;
static void phase(const char *what)
{
	if (timing)
		fprintf(stderr, "dptp-run: %8.3f ms %s\n", (dptp_now() - t_start) * 1e3, what);
}

static void record(struct job *j, struct worker *w, int exitcode, const char *abort_msg)
{
	struct failure *g = realloc(j->fail, (j->nfail + 1) * sizeof(*g));
	if (!g)
		return;
	j->fail = g;
	failure_init(&j->fail[j->nfail], w->local_rank, w->global_rank, w->pid, exitcode, w->error_file, abort_msg);
	events_note_failure(&j->ev, &j->fail[j->nfail++]);
	w->recorded = true;
}

static void begin_stop(struct job *j, int sig)
{
	char name[32];
	struct dptp_err err = {0};
	if (j->stopping)
		return;
	j->stopping = true;
	/* the PMIx server lets go of the workers first: their deaths must not
	 * drop several connections at once while the library completes a
	 * collective (pmix_srv_release_client says why) */
	for (unsigned i = 0; i < j->n; i++)
		if (j->w[i].alive)
			pmix_srv_release_client(&j->srv, j->w[i].global_rank);
	if (pmix_srv_wait_released(&j->srv, 1.0, &err) < 0)
		logmsg('W', "%s; signalling the workers anyway", err.msg);
	j->deadline = dptp_now() + j->stop_timeout;
	for (unsigned i = 0; i < j->n; i++) {
		struct worker *w = &j->w[i];
		if (!w->alive)
			continue;
		logmsg('W', "Sending process %d closing signal %s", (int)w->pid, signame(sig, name, sizeof(name)));
		killpg(w->pid, sig);
		/* a stopped worker (SIGSTOP, a debugger's stop) only acts on the
		 * signal once continued; without this it would sit out the whole
		 * grace period before SIGKILL */
		if (sig != SIGKILL && sig != SIGCONT)
			killpg(w->pid, SIGCONT);
	}
}

static void on_abort(void *ctx, unsigned rank, int status, const char *msg)
{
	struct job *j = ctx;
	struct worker *w;
	char *text = NULL;
	if (rank < j->info.base_global_rank || rank - j->info.base_global_rank >= j->n)
		return;
	w = &j->w[rank - j->info.base_global_rank];
	logmsg('E', "rank %u called PMIx_Abort(%d): %s", rank, status, msg);
	if (!j->stopping && !w->recorded) {
		if (asprintf(&text, "PMIx_Abort(%d) called by PID %d: %s", status, (int)w->pid, msg) < 0)
			text = NULL;
		record(j, w, status ? status : 1, text);
		free(text);
	}
	begin_stop(j, SIGTERM);
}

static void on_refuse(void *ctx, unsigned rank, const char *msg)
{
	struct job *j = ctx;
	struct worker *w;
	if (rank < j->info.base_global_rank || rank - j->info.base_global_rank >= j->n)
		return;
	w = &j->w[rank - j->info.base_global_rank];
	if (!j->stopping && !w->recorded)
		record(j, w, 1, msg);
	begin_stop(j, SIGTERM);
}

/* The PMIx library crashed in its progress thread (pmix/crash_guard.h):
 * the job cannot go on without its PMIx server, as without a node. */
static void on_pmix_crashed(void *ctx)
{
	struct job *j = ctx;
	if (!j->lost[0])
		snprintf(j->lost, sizeof(j->lost), "the PMIx server's library crashed in its progress thread");
	begin_stop(j, SIGTERM);
}

static bool on_fence(void *ctx, struct pmix_srv_fence *f)
{
	struct job *j = ctx;
	if (!j->xn)
		return false;
	xnode_fence(j->xn, f);
	return true;
}

static bool on_dmodex(void *ctx, struct pmix_srv_dmodex *d)
{
	struct job *j = ctx;
	if (!j->xn)
		return false;
	xnode_dmodex(j->xn, d);
	return true;
}

static void on_dmodex_local(void *ctx, void *token, bool found, const void *data, size_t len)
{
	struct job *j = ctx;
	if (j->xn)
		xnode_dmodex_answer(j->xn, token, found, data, len);
	else
		free(token);
}

static void on_notify(void *ctx, const void *blob, size_t len)
{
	struct job *j = ctx;
	if (j->xn)
		xnode_notify(j->xn, blob, len);
}

static void reap(struct job *j)
{
	int st;
	pid_t pid;
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		struct worker *w = NULL;
		for (unsigned i = 0; i < j->n; i++)
			if (j->w[i].pid == pid && j->w[i].alive)
				w = &j->w[i];
		if (!w)
			continue;
		w->alive = false;
		j->alive--;
		w->exitcode = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
		audit_worker_exited(j->o->audit, (int)w->global_rank, pid, j->restart_count, st);
		pmix_srv_worker_exited(&j->srv, w->global_rank, w->exitcode);
		/* what the worker left behind in its process group goes too */
		killpg(pid, SIGKILL);
		guard_forget(&j->guard, pid);
		if (w->exitcode != 0 && !j->stopping) {
			record(j, w, w->exitcode, NULL);
			begin_stop(j, SIGTERM);
		} else if (w->exitcode == 0 && !j->stopping &&
			   pmix_srv_client_state(&j->srv, w->global_rank) == PMIX_SRV_CLIENT_INIT) {
			/* as mpirun: a PMIx client gone without PMIx_Finalize
			 * left its peers waiting in collectives; exit 0 is no
			 * success then (workers that never called PMIx_Init
			 * keep torchrun's rule) */
			logmsg('E', "rank %u (pid %d) exited with code 0 without calling PMIx_Finalize (MPI_Finalize)",
				w->global_rank, (int)pid);
			record(j, w, 0, "exited with code 0 after PMIx_Init without calling PMIx_Finalize (MPI_Finalize): an abnormal end");
			begin_stop(j, SIGTERM);
		}
	}
}

static bool in_filter(const struct run_opts *o, unsigned lr)
{
	if (!o->local_ranks_filter)
		return true;
	for (size_t i = 0; i < o->nlocal_ranks_filter; i++)
		if (o->local_ranks_filter[i] == (int)lr)
			return true;
	return false;
}

/* Sets *child to the fd the worker's stream `bit` (1 out, 2 err) gets, -1
 * to inherit; opens a tee stream when the launcher copies it. */
static int setup_stream(struct job *j, struct worker *w, const char *attempt_dir, int bit, int *child, struct dptp_err *err)
{
	const struct run_opts *o = j->o;
	unsigned lr = w->local_rank;
	int rd = run_opts_std_for(&o->redirects, lr) | run_opts_std_for(&o->tee, lr);
	int tee = run_opts_std_for(&o->tee, lr);
	bool shown = in_filter(o, lr);
	char path[4300];
	*child = -1;
	if (!(rd & bit)) {
		if (shown)
			return 0;
		*child = open("/dev/null", O_WRONLY | O_CLOEXEC);
		return *child < 0 ? dptp_err_set(err, -errno, "/dev/null: %s", strerror(errno)) : 0;
	}
	if (j->logs.devnull)
		snprintf(path, sizeof(path), "/dev/null");
	else
		snprintf(path, sizeof(path), "%s/%u/%s", attempt_dir, lr, bit == 1 ? "stdout.log" : "stderr.log");
	int file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (file < 0)
		return dptp_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
	if (!(tee & bit) || !shown) {
		*child = file;
		return 0;
	}
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0) {
		close(file);
		return dptp_err_set(err, -errno, "pipe: %s", strerror(errno));
	}
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	char *prefix;
	const char *tmpl = getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
	char rank[16], lrs[16];
	snprintf(rank, sizeof(rank), "%u", w->global_rank);
	snprintf(lrs, sizeof(lrs), "%u", lr);
	if (tmpl) {
		const char *keys[] = {"role_name", "rank", "local_rank"};
		const char *vals[] = {o->role, rank, lrs};
		prefix = env_template_subst(tmpl, keys, vals, 3);
	} else if (asprintf(&prefix, "[%s%u]:", o->role, lr) < 0) {
		prefix = NULL;
	}
	struct logs_stream *ls = bit == 1 ? &w->out : &w->err;
	if (!prefix || logs_stream_open(ls, p[0], file, bit == 1 ? STDOUT_FILENO : STDERR_FILENO, prefix) < 0) {
		if (!ls->prefix)
			free(prefix);
		logs_stream_release(ls);
		close(p[0]);
		close(p[1]);
		close(file);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	logs_stream_duplicate(ls, j->dup_fd[bit - 1], &j->dup[bit - 1]);
	*child = p[1];
	return 0;
}

static int start_workers(struct job *j, const char *attempt_dir, struct dptp_err *err)
{
	const struct run_opts *o = j->o;
	for (unsigned i = 0; i < j->n; i++) {
		struct worker *w = &j->w[i];
		struct worker_env_spec spec = {
			.local_rank = i,
			.global_rank = w->global_rank,
			.role_rank = j->info.base_role_rank + i,
			.local_world_size = j->n,
			.rdzv = &j->info,
			.role = o->role,
			.restart_count = j->restart_count,
			.max_restarts = o->max_restarts,
			.error_file = w->error_file,
			.virtual_local_rank = o->virtual_local_rank,
			.nproc_per_node = o->nproc,
			.signals_to_handle = o->signals_to_handle,
		};
		int out_fd = -1, err_fd = -1, rc;
		char **envp = env_build(&spec);
		char **argv = env_argv_for(&j->cmd, i);
		pid_t pid = 0;
		if (!envp || !argv) {
			env_strv_free(envp);
			env_strv_free(argv);
			return dptp_err_set(err, -ENOMEM, "out of memory");
		}
		rc = pmix_srv_setup_fork(&j->srv, w->global_rank, &envp, err);
		if (rc == 0)
			rc = setup_stream(j, w, attempt_dir, 1, &out_fd, err);
		if (rc == 0)
			rc = setup_stream(j, w, attempt_dir, 2, &err_fd, err);
		if (rc == 0) {
			struct spawn_req req = {
				.path = j->cmd.path, .argv = argv, .envp = envp,
				.stdout_fd = out_fd, .stderr_fd = err_fd,
				.guard = &j->guard,
			};
			if (i < j->numa.n) {
				req.cpus = j->numa.masks[i].bits;
				req.cpus_len = sizeof(j->numa.masks[i].bits);
			}
			rc = spawn_worker(&req, &pid);
			if (pid > 0) {
				w->pid = pid;
				w->alive = true; /* watched by the guard since before its exec */
				j->alive++;
				pmix_srv_worker_started(&j->srv, w->global_rank, pid, j->cmd.path);
				audit_worker_started(o->audit, (int)w->global_rank, (int)i, pid, j->restart_count);
			}
			if (rc < 0 && (-rc & SPAWN_ERR_AFFINITY)) {
				rc = -(-rc & ~SPAWN_ERR_AFFINITY);
				dptp_err_set(err, rc, "cannot bind local rank %u to its CPUs (--numa-binding=%s): %s", i,
					o->numa_binding, strerror(-rc));
			} else if (rc < 0) {
				j->exec_failed = true;
				dptp_err_set(err, rc, "cannot execute '%s': %s (errno %d)", j->cmd.path, strerror(-rc), -rc);
			}
		}
		if (out_fd >= 0)
			close(out_fd);
		if (err_fd >= 0)
			close(err_fd);
		env_strv_free(envp);
		env_strv_free(argv);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static bool streams_open(const struct job *j)
{
	for (unsigned i = 0; i < j->n; i++)
		if (j->w[i].out.fd >= 0 || j->w[i].err.fd >= 0)
			return true;
	return false;
}

/* torch's agent fails on the first error of its store (its monitor loop's
 * num_nodes_waiting()); here the store is in doubt from then on (from the
 * request's start t when it went unanswered) and probed (xnode.h). */
static void store_doubt(struct job *j, int rc, const struct dptp_err *e, double t)
{
	xnode_store_doubt(j->xn, e->msg, rc == -ETIMEDOUT ? t : dptp_now());
}

static void monitor(struct job *j)
{
	const struct pmix_srv_sink sink = {.abort = on_abort, .fence = on_fence, .dmodex = on_dmodex,
		.dmodex_local = on_dmodex_local, .notify = on_notify, .refuse = on_refuse, .crashed = on_pmix_crashed,
		.ctx = j};
	size_t cap = 2 + 2 * (size_t)j->n + XNODE_MAX_FDS;
	struct pollfd *pfd = calloc(cap, sizeof(*pfd));
	struct logs_stream **map = calloc(cap, sizeof(*map));
	double drain_deadline = 0;
	if (!pfd || !map) {
		free(pfd);
		free(map);
		return;
	}
	for (;;) {
		double now = dptp_now();
		if (j->alive == 0 && j->xn && !j->stopping && j->nfail == 0 && j->peer_failed < 0) {
			/* the other nodes' workers may still read ours: serve
			 * them until every node's workers are done */
			xnode_finish(j->xn, 300.0);
			if (!xnode_finished(j->xn)) {
				drain_deadline = 0;
				goto wait;
			}
		}
		if (j->alive == 0) {
			if (!streams_open(j))
				break;
			if (drain_deadline == 0)
				drain_deadline = now + 2.0;
			else if (now >= drain_deadline)
				break;
		}
		if (j->stopping && j->alive && now >= j->deadline) {
			if (!j->killed) {
				char a[32], b[32];
				for (unsigned i = 0; i < j->n; i++)
					if (j->w[i].alive) {
						logmsg('W', "Unable to shutdown process %d via %s, forcefully exiting via %s",
							(int)j->w[i].pid, signame(j->signal_received ? j->signal_received : SIGTERM, a, sizeof(a)),
							signame(SIGKILL, b, sizeof(b)));
						killpg(j->w[i].pid, SIGKILL);
					}
				j->killed = true;
				j->deadline = now + 10.0;
			} else {
				logmsg('E', "%u worker(s) did not exit 10 s after SIGKILL; giving up on them", j->alive);
				break;
			}
		}
wait:;
		double timeout = j->o->monitor_interval;
		if (j->stopping && j->alive && j->deadline - now < timeout)
			timeout = j->deadline - now;
		if (j->alive == 0 && drain_deadline > 0 && drain_deadline - now < timeout)
			timeout = drain_deadline - now;
		timeout = xnode_poll_timeout(j->xn, timeout);
		if (timeout < 0 || pmix_srv_pending(&j->srv)) /* upcalls read during a stop's wait */
			timeout = 0;

		size_t n = 0, nx;
		pfd[n++] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = pmix_srv_fd(&j->srv), .events = POLLIN};
		nx = xnode_pollfds(j->xn, pfd + n, XNODE_MAX_FDS);
		size_t xfirst = n;
		n += nx;
		for (unsigned i = 0; i < j->n; i++) {
			struct logs_stream *s[2] = {&j->w[i].out, &j->w[i].err};
			for (int k = 0; k < 2; k++)
				if (s[k]->fd >= 0) {
					map[n] = s[k];
					pfd[n++] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
				}
		}
		int r = poll(pfd, (nfds_t)n, (int)(timeout * 1000.0 + 0.999));
		if (r < 0 && errno != EINTR)
			break;
		if (pfd[0].revents) {
			struct signalfd_siginfo si[16];
			ssize_t got;
			while ((got = read(j->sigfd, si, sizeof(si))) > 0)
				for (size_t k = 0; k < (size_t)got / sizeof(si[0]); k++) {
					int sig = (int)si[k].ssi_signo;
					if (sigismember(&j->forward, sig)) {
						for (unsigned i = 0; i < j->n; i++)
							if (j->w[i].alive)
								killpg(j->w[i].pid, sig);
						continue;
					}
					if (sig == SIGCHLD || j->signal_received)
						continue;
					logmsg('W', "Received %d death signal, shutting down workers", sig);
					j->signal_received = sig;
					j->stopping = false; /* forward this very signal */
					begin_stop(j, sig);
				}
		}
		if (j->xn) {
			int who = xnode_handle(j->xn, pfd + xfirst, nx);
			const char *why = NULL, *gone = xnode_store_gone(j->xn);
			int lost = xnode_lost(j->xn, &why);
			if (gone && !j->lost[0] && !j->stopping) {
				/* torch's agent raises RendezvousConnectionError
				 * from its monitor loop and stops its workers; no
				 * word to the store: it is not there */
				char host0[300] = ""; /* static: node 0 hosts it */
				const struct rdzv_node *n0 = &j->info.nodes[0];
				if (!j->rdzv.c10d)
					snprintf(host0, sizeof(host0), " (node 0: %s, launcher pid %d, ranks %u-%u)", n0->host, n0->pid,
						n0->base, n0->base + n0->nproc - 1);
				snprintf(j->lost, sizeof(j->lost), "the rendezvous store at %s:%u%s is gone (%s)", j->info.store_addr,
					j->info.store_port, host0, gone);
				logmsg('E', "%s: stopping this node's workers", j->lost);
				j->store_gone = true;
				j->rdzv.quick = true; /* nothing to close the rendezvous on */
				begin_stop(j, SIGTERM);
			} else if (lost >= 0 && !j->lost[0]) {
				const struct rdzv_node *nd = &j->info.nodes[lost];
				snprintf(j->lost, sizeof(j->lost), "node %d (%s, launcher pid %d, ranks %u-%u) was lost: %s", lost,
					nd->host, nd->pid, nd->base, nd->base + nd->nproc - 1, why);
				logmsg('E', "%s; stopping the local workers", j->lost);
				j->peer_failed = lost;
				rendezvous_report_failure(&j->rdzv); /* the other nodes stop too */
				begin_stop(j, SIGTERM);
			} else if (who >= 0 && j->peer_failed < 0) {
				j->peer_failed = who;
				logmsg('E', "another node reported a failed attempt %u; stopping the local workers", j->restart_count);
				begin_stop(j, SIGTERM);
			}
		}
		/* also without revents: a worker's last upcalls must be seen
		 * before its exit is judged */
		pmix_srv_dispatch(&j->srv, &sink);
		for (size_t k = xfirst + nx; k < n; k++)
			if (pfd[k].revents)
				logs_stream_pump(map[k]);
		reap(j); /* on SIGCHLD, and as the monitor-interval safety net */
		/* after reap: a worker that failed meanwhile counts as a failure */
		if (j->rdzv.c10d && !(j->alive && !j->stopping)) {
			/* torch's heartbeat timer runs while the agent waits, too */
			struct dptp_err e = {0};
			double t = dptp_now();
			int rc = rendezvous_heartbeat(&j->rdzv, &e);
			if (rc < 0)
				store_doubt(j, rc, &e, t);
			if (rc < 0 && !j->tick_failed) {
				logmsg('W', "rendezvous heartbeat: %s", e.msg);
				j->tick_failed = true;
			}
		} else if (j->rdzv.c10d) {
			struct dptp_err e = {0};
			double t = dptp_now();
			int waiting = rendezvous_tick(&j->rdzv, &e);
			if (waiting < 0)
				store_doubt(j, waiting, &e, t);
			if (waiting > 0) {
				if (j->info_log)
					logmsg('I', "[%s] Detected %d new nodes from group_rank=%u; will restart worker group", j->o->role,
						waiting, j->info.group_rank);
				j->regroup = true;
				begin_stop(j, SIGTERM);
			} else if (waiting < 0 && !j->tick_failed) {
				logmsg('W', "rendezvous heartbeat: %s", e.msg);
				j->tick_failed = true;
			}
		}
	}
	for (unsigned i = 0; i < j->n; i++) {
		logs_stream_release(&j->w[i].out);
		logs_stream_release(&j->w[i].err);
	}
	free(pfd);
	free(map);
}

static void free_workers(struct job *j)
{
	for (unsigned i = 0; i < j->n && j->w; i++) {
		logs_stream_release(&j->w[i].out);
		logs_stream_release(&j->w[i].err);
		free(j->w[i].error_file);
	}
	free(j->w);
	j->w = NULL;
	for (int k = 0; k < 2; k++) {
		if (j->dup_fd[k] >= 0)
			close(j->dup_fd[k]);
		j->dup_fd[k] = -1;
	}
	for (size_t i = 0; i < j->nfail; i++)
		failure_release(&j->fail[i]);
	free(j->fail);
	j->fail = NULL;
	j->nfail = 0;
}

/* The death signal waiting in the signalfd (SIGCHLD skipped), or 0. */
static int pending_signal(struct job *j)
{
	struct signalfd_siginfo si;
	while (read(j->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		if (si.ssi_signo != SIGCHLD && !sigismember(&j->forward, (int)si.ssi_signo))
			return (int)si.ssi_signo;
	return 0;
}

static struct event_worker worker_event(const struct job *j, unsigned i)
{
	const struct worker *w = &j->w[i];
	struct event_worker ew = {
		.local_rank = i, .global_rank = w->global_rank, .role_rank = j->info.base_role_rank + i,
		.role_world_size = j->info.global_world_size, .pid = w->pid,
	};
	for (size_t k = 0; k < j->nfail; k++)
		if (j->fail[k].local_rank == i)
			ew.fail = &j->fail[k];
	return ew;
}

/* torch's end of run: each worker of the last attempt (failed ones FAILED,
 * the others TERMINATED when the group failed), then the agent's
 * SUCCEEDED: its run returned. */
static void end_events(struct job *j, bool failed)
{
	j->ev.total_run_time = (long)(dptp_now() - j->ev.start);
	for (unsigned i = 0; j->w && i < j->n; i++) {
		struct event_worker ew = worker_event(j, i);
		events_worker(&j->ev, ew.fail ? "FAILED" : failed ? "TERMINATED" : "SUCCEEDED", j->restart_count, &ew);
	}
	events_agent(&j->ev, "SUCCEEDED", j->restart_count, -1, NULL);
}

/* The run ended by an error or a signal: the agent's FAILED. */
static void failed_event(struct job *j, const char *why);

/* As torchrun's @record on main when the launcher itself raises: the
 * error goes to the launcher's own TORCHELASTIC_ERROR_FILE, if it has one. */
static void record_own_failure(const struct job *j, const char *what)
{
	const char *parent = getenv("TORCHELASTIC_ERROR_FILE");
	if (parent && *parent && failure_record_launcher(parent, what) == 0 && j->info_log)
		logmsg('I', "recorded this launcher's error in %s", parent);
}

static void signal_exception(struct job *j)
{
	char why[96];
	snprintf(why, sizeof(why), "SignalException: Process %d got signal: %d", (int)getpid(), j->signal_received);
	fprintf(stderr, "%s\n", why);
	record_own_failure(j, why);
}

static void signal_event(struct job *j)
{
	char why[96];
	snprintf(why, sizeof(why), "SignalException: Process %d got signal: %d", (int)getpid(), j->signal_received);
	failed_event(j, why);
}

static void failed_event(struct job *j, const char *why)
{
	j->ev.total_run_time = (long)(dptp_now() - j->ev.start);
	events_agent(&j->ev, "FAILED", j->restart_count, -1, why);
}

/* Forgets what the last attempt left in the job. */
static void attempt_reset(struct job *j)
{
	j->stopping = j->killed = j->exec_failed = false;
	j->signal_received = 0;
	j->alive = 0;
	j->peer_failed = -1;
	j->lost[0] = '\0';
	j->store_gone = false;
	j->regroup = false;
}

/* Several dptp-run nodes: the cross-node link over node 0's store
 * (fences, events, pids; heartbeats of its own in a static job). */
static int start_xnode(struct job *j, struct dptp_err *err)
{
	const struct run_opts *o = j->o;
	if (!j->info.nodes)
		return 0;
	double iv = o->c10d.keep_alive_interval, dead = iv * o->c10d.keep_alive_max_attempt;
	DPTP_TRY(xnode_start(&j->xn, j->info.store_addr, j->info.store_port, j->info.dptp_prefix, j->info.nodes,
		j->info.group_world_size, j->info.group_rank, o->rdzv_timeout,
		/* static: heartbeats of its own (c10d has the rendezvous' keep-alive,
		 * and a node leaving the round is no loss there) */
		j->rdzv.c10d ? 0 : iv, dead, &j->srv, err));
	/* the store is gone when refused or broken as long as a node is dead
	 * without heartbeats, or silent as long as torch waits for a store's
	 * reply (read_timeout) */
	xnode_store_bounds(j->xn, iv, dead, o->c10d.read);
	return 0;
}

/* torch opens (truncates) the file of each given filter list for every
 * attempt, tee or not; --log-dir /dev/null has no attempt folder. */
static int open_filtered_logs(struct job *j, const char *attempt_dir, struct dptp_err *err)
{
	for (int k = 0; k < 2; k++) {
		char path[4300];
		if (!j->dup[k].n || j->logs.devnull)
			continue;
		snprintf(path, sizeof(path), "%s/filtered_%s.log", attempt_dir, k ? "stderr" : "stdout");
		j->dup_fd[k] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
		if (j->dup_fd[k] < 0)
			return dptp_err_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
	}
	return 0;
}

/* This attempt's workers, not started yet: ranks, output streams, error
 * files. */
static int make_workers(struct job *j, const char *attempt_dir, struct dptp_err *err)
{
	j->w = calloc(j->n, sizeof(*j->w));
	if (!j->w)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; i < j->n; i++) {
		struct worker *w = &j->w[i];
		w->local_rank = i;
		w->global_rank = j->info.base_global_rank + i;
		logs_stream_init(&w->out);
		logs_stream_init(&w->err);
		if (j->logs.devnull)
			w->error_file = strdup("");
		else if (asprintf(&w->error_file, "%s/%u/error.json", attempt_dir, i) < 0)
			w->error_file = NULL;
		if (!w->error_file)
			return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	return 0;
}

/* The attempt's nspace and its clients, when the workers get a PMIx
 * server (not in a job of mixed launchers). */
static int register_nspace(struct job *j, struct dptp_err *err)
{
	char nspace[128];
	if (!j->srv.up || j->info.mixed)
		return 0;
	snprintf(nspace, sizeof(nspace), "%s", j->info.nspace);
	return pmix_srv_register_job(&j->srv, nspace, j->n, j->info.base_global_rank, j->info.global_world_size,
		j->hostname, getuid(), getgid(), j->info.nodes, j->info.group_world_size, j->info.group_rank, err);
}

/* The other nodes' proc tables list ours. */
static void publish_pids(struct job *j)
{
	pid_t *pids = calloc(j->n, sizeof(*pids));
	for (unsigned i = 0; pids && i < j->n; i++)
		pids[i] = j->w[i].pid;
	if (pids)
		xnode_publish_pids(j->xn, pids, j->n);
	free(pids);
}

/* What an attempt whose workers are done comes to. */
static enum attempt_result attempt_verdict(struct job *j)
{
	const struct run_opts *o = j->o;
	if (j->signal_received)
		return ATT_SIGNALLED;
	if (j->regroup && j->nfail == 0)
		return ATT_REGROUP;
	/* the siblings that ended badly once the first failure stopped them */
	for (unsigned i = 0; i < j->n; i++)
		if (j->w[i].exitcode != 0 && !j->w[i].recorded && !j->w[i].alive)
			record(j, &j->w[i], j->w[i].exitcode, NULL);
	if (j->lost[0])
		return ATT_FAILED;
	if (!j->nfail && j->peer_failed >= 0) {
		logmsg('E', "the job failed on another node; this node's workers had succeeded");
		return ATT_FAILED;
	}
	if (j->nfail) {
		const struct failure *f = &j->fail[0];
		logmsg('E', "failed (exitcode: %d) local_rank: %u (pid: %d) of binary: %s", f->exitcode, f->local_rank,
			(int)f->pid, o->no_python && !o->run_path ? o->script : j->cmd.path);
		return ATT_FAILED;
	}
	return ATT_OK;
}

static enum attempt_result attempt(struct job *j)
{
	struct dptp_err err = {0};
	char *attempt_dir = NULL;
	enum attempt_result res = ATT_ERROR;

	attempt_reset(j);
	double t0 = dptp_now();
	int nrc = j->rdzv.ops->next(&j->rdzv, j->restart_count, &j->info, &err);
	double rdzv_ms = (dptp_now() - t0) * 1e3;
	if (nrc == -EINTR && (j->signal_received = pending_signal(j)) > 0) {
		/* torch records it on the way out, unless the signal's default
		 * action ends it first (no handler yet, not SIGINT) */
		if (j->started_once || j->signal_received == SIGINT)
			events_agent(&j->ev, "RENDEZVOUS", j->restart_count, rdzv_ms, NULL);
		return ATT_RDZV_SIGNAL;
	}
	events_agent(&j->ev, "RENDEZVOUS", j->restart_count, rdzv_ms, NULL);
	if (nrc < 0)
		goto error;
	phase("rendezvous done");
	if (j->info.mixed && !j->warned_mixed) {
		logmsg('W', "not every node runs dptp-run: workers get no PMIx server (dptp-check then bootstraps from the "
			"torchrun environment; MPI_Init fails rather than start a one-process world)");
		j->warned_mixed = true;
	}
	if (start_xnode(j, &err) < 0 || logs_dirs_attempt(&j->logs, j->restart_count, j->n, &attempt_dir, &err) < 0 ||
	    open_filtered_logs(j, attempt_dir, &err) < 0)
		goto error;
	t0 = dptp_now();
	if (make_workers(j, attempt_dir, &err) < 0)
		goto error;
	/* as torch: the event still shows the previous group */
	events_agent(&j->ev, "ASSIGN_WORKER_RANKS", j->restart_count, (dptp_now() - t0) * 1e3, NULL);
	j->ev.have_group = true;
	j->ev.group_rank = j->info.group_rank;
	j->ev.group_world_size = j->info.group_world_size;
	if (register_nspace(j, &err) < 0)
		goto error;
	phase("nspace and clients registered");
	if (start_workers(j, attempt_dir, &err) < 0) {
		fprintf(stderr, "dptp-run: error: %s\n", err.msg);
		snprintf(j->last_error, sizeof(j->last_error), "%s", err.msg);
		rendezvous_report_error(&j->rdzv);
		begin_stop(j, SIGTERM);
		monitor(j);
		res = ATT_ERROR;
		goto out;
	}
	phase("workers started");
	if (j->xn)
		publish_pids(j);
	j->started_once = true;
	for (unsigned i = 0; i < j->n; i++) {
		struct event_worker ew = worker_event(j, i);
		events_worker(&j->ev, "START", j->restart_count, &ew);
	}
	monitor(j);
	phase("workers done");
	xnode_stop(j->xn); /* fences still pending fail: their workers are gone */
	j->xn = NULL;
	res = attempt_verdict(j);
	goto out;
error:
	fprintf(stderr, "dptp-run: error: %s\n", err.msg);
	snprintf(j->last_error, sizeof(j->last_error), "%s", err.msg);
	if (nrc >= 0) /* the other nodes stop now, not after their timeouts */
		rendezvous_report_error(&j->rdzv);
out:
	xnode_stop(j->xn);
	j->xn = NULL;
	/* the workers are gone: a slot one held when it was stopped (or
	 * died) in its setup goes too, as does any other dead job's */
	dptp_shm_sweep();
	free(attempt_dir);
	return res;
}

/* A death signal while waiting for the other nodes. Before any worker ran,
 * torchrun has no handler of its own yet: SIGINT ends it by
 * KeyboardInterrupt, the others by their default action (status < 0: the
 * caller re-raises it once everything is cleaned up). After, its handler
 * raises SignalException: exit 1. */
static void rdzv_signal_exit(struct job *j, int *status)
{
	logmsg('W', "Received %d death signal during the rendezvous, shutting down", j->signal_received);
	j->rdzv.no_grace = true;
	if (j->started_once) {
		signal_exception(j);
		*status = 1;
		return;
	}
	if (j->signal_received == SIGINT)
		fputs("KeyboardInterrupt\n", stderr); /* torch's agent then still closes the rendezvous */
	else
		j->rdzv.quick = true;
	*status = -j->signal_received;
}

/* The PMIx server's private folders go to the guard as they are made. */
static void guard_dir(void *guard, const char *dir)
{
	guard_remove_dir(guard, dir);
}

/* --logs-specs: torch loads the entry point and raises ValueError without
 * one; dptp-run cannot load a Python class: it says so and goes on.
 * Returns 0 to go on, else the exit status. */
static int check_logs_specs(struct job *j)
{
	const struct run_opts *o = j->o;
	struct dptp_err err = {0};
	char msg[512];
	int rc;

	if (!o->logs_specs)
		return 0;
	if ((rc = env_logs_specs_known(o->logs_specs, &err)) == 1) {
		fprintf(stderr, "dptp-run: warning: --logs-specs=%s is a Python entry point and is not loaded; the default layout under --log-dir is used\n",
			o->logs_specs);
		return 0;
	}
	if (rc == 0)
		snprintf(msg, sizeof(msg), "ValueError: Could not find entrypoint under 'torchrun.logs_specs[%s]' key",
			 o->logs_specs);
	else
		snprintf(msg, sizeof(msg), "--logs-specs=%s: %s", o->logs_specs, err.msg);
	fprintf(stderr, rc == 0 ? "%s\n" : "dptp-run: error: %s\n", msg);
	record_own_failure(j, msg);
	return 1;
}

/* Every signal we care about arrives through the signalfd; blocked before
 * PMIx starts its threads so that they inherit the mask. <0 (said) when
 * there is no signalfd. */
static int take_signals(struct job *j)
{
	const struct run_opts *o = j->o;
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	for (size_t i = 0; i < o->nsignals; i++)
		sigaddset(&set, o->signals[i]);
	/* as mpirun: SIGUSR1 and SIGUSR2 go to the workers (unless
	 * --signals-to-handle makes them death signals, torchrun's rule) */
	sigset_t all = set;
	sigemptyset(&j->forward);
	for (int s = SIGUSR1; s; s = s == SIGUSR1 ? SIGUSR2 : 0)
		if (!sigismember(&set, s)) {
			sigaddset(&j->forward, s);
			sigaddset(&all, s);
		}
	if (sigprocmask(SIG_BLOCK, &all, NULL) < 0 || (j->sigfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
		fprintf(stderr, "dptp-run: error: signalfd: %s\n", strerror(errno));
		return -1;
	}
	signal(SIGPIPE, SIG_IGN); /* a closed console must not kill the launcher */
	sigdelset(&set, SIGCHLD);
	j->rdzv_sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	return 0;
}

/* What every attempt shares: the rendezvous, the log folders, the worker
 * command, the audit, the event log, the output filters, the NUMA plan,
 * the worker guard and the PMIx server. Returns 0, else the exit status
 * (what failed is said). */
static int job_setup(struct job *j)
{
	const struct run_opts *o = j->o;
	struct dptp_err err = {0};
	int rc;

	if (rendezvous_init(&j->rdzv, o, &err) < 0 || logs_dirs_init(&j->logs, o->log_dir, j->rdzv.run_id, &err) < 0 ||
	    env_build_command(o, &j->cmd, &err) < 0 || audit_job_start(o->audit, j->logs.run_dir, o->nproc, &err) < 0) {
		fprintf(stderr, "dptp-run: error: %s\n", err.msg);
		return 1;
	}
	if (events_init(&j->ev, o->event_log_handler, STDERR_FILENO) < 0) {
		fprintf(stderr, "dptp-run: error: --event-log-handler=%s: there is no such handler (console, dynamic_rendezvous, null)\n",
			o->event_log_handler);
		return 1;
	}
	j->ev.run_id = j->rdzv.run_id;
	j->ev.role = o->role;
	j->ev.backend = o->standalone ? "c10d" : o->rdzv_backend;
	j->ev.max_restarts = o->max_restarts;
	{
		const char *base = strrchr(j->cmd.path, '/');
		j->ev.entry_point = strdup(o->run_path ? "run_script_path" : base ? base + 1 : j->cmd.path);
	}
	if (logs_filters_parse(o->dup_stdout_filters, &j->dup[0]) < 0 || logs_filters_parse(o->dup_stderr_filters, &j->dup[1]) < 0) {
		fprintf(stderr, "dptp-run: error: out of memory\n");
		return 1;
	}
	/* torch binds as each worker starts and fails there; the devices and
	 * the topology do not change, so a bad setup fails before the rendezvous */
	if (o->numa_binding && numa_plan_build(&j->numa, o->numa_binding, o->nproc, &err) < 0) {
		fprintf(stderr, "dptp-run: error: --numa-binding=%s: %s\n", o->numa_binding, err.msg);
		return 1;
	}
	j->rdzv.abort_fd = j->rdzv_sigfd;
	j->rdzv.info_log = j->info_log;
	phase("rendezvous, log dirs");
	spawn_prepare();
	if ((rc = guard_start(&j->guard)) < 0)
		fprintf(stderr, "dptp-run: warning: no worker guard (%s): a SIGKILLed launcher leaves its workers' children\n",
			strerror(-rc));
	dptp_hostname(j->hostname, sizeof(j->hostname));
	if ((rc = pmix_srv_init(&j->srv, guard_dir, &j->guard, &err)) == -EINVAL) {
		fprintf(stderr, "dptp-run: error: %s\n", err.msg);
		return 2;
	} else if (rc < 0) {
		fprintf(stderr, "dptp-run: warning: %s; workers get no PMIx server\n", err.msg);
	}
	j->srv.slots = rdzv_common_slots();
	phase("pmix server up");
	return 0;
}

/* A successful attempt of several nodes: torchrun's exit barrier keeps
 * node 0 (the store) up until every node is done. ATT_FAILED when another
 * node reported a failed attempt meanwhile. */
static enum attempt_result exit_barrier(struct job *j)
{
	struct dptp_err err = {0};
	int b = rendezvous_exit_barrier(&j->rdzv, j->barrier_timeout, &err);
	if (b < 0)
		logmsg('W', "exit barrier: %s", err.msg);
	else if (b == 1) {
		logmsg('E', "another node reported a failed attempt %u after this node's workers succeeded",
			j->restart_count);
		return ATT_FAILED;
	}
	return ATT_OK;
}

/* No restart left: torchrun's ChildFailedError with the failure report,
 * and the root cause in the parent's error file. */
static void report_job_failed(struct job *j)
{
	char host[256];

	end_events(j, true);
	dptp_getfqdn(host, sizeof(host));
	if (j->nfail) { /* none when only another node failed: it reports */
		fputs("ChildFailedError: \n", stderr);
		failure_report_write(stderr, j->cmd.entry_name, j->fail, j->nfail, host);
		/* as torchrun's @record on its own main: schedulers that
		 * started the launcher read the root cause there */
		const char *parent = getenv("TORCHELASTIC_ERROR_FILE");
		if (parent && *parent && failure_dump_root_cause(&j->fail[failure_root(j->fail, j->nfail)], parent) == 0 &&
		    j->info_log)
			logmsg('I', "dumped error file to parent's %s", parent);
	}
}

/* Runs attempts until one ends the job: restarts after failures while
 * --max-restarts allows, regroups without counting. Returns the exit
 * status (<0: a death signal, re-raised by job_end()). */
static int run_attempts(struct job *j)
{
	const struct run_opts *o = j->o;
	int status = 1;

	for (;;) {
		enum attempt_result r = attempt(j);
		if (r == ATT_OK && j->rdzv.multi)
			r = exit_barrier(j);
		if (r == ATT_OK) {
			end_events(j, false);
			status = 0;
			break;
		}
		if (r == ATT_REGROUP) { /* a membership change is no failure: not counted */
			free_workers(j);
			pmix_srv_deregister_job(&j->srv);
			continue;
		}
		if (r == ATT_RDZV_SIGNAL) {
			rdzv_signal_exit(j, &status);
			if (j->started_once)
				signal_event(j);
			break;
		}
		if (r == ATT_FAILED && !j->store_gone)
			rendezvous_report_failure(&j->rdzv);
		if (r == ATT_SIGNALLED) {
			rendezvous_report_failure(&j->rdzv); /* the other nodes stop now, not on a lost heartbeat */
			j->rdzv.no_grace = true;
			signal_event(j);
			signal_exception(j);
			break;
		}
		if (r == ATT_ERROR) {
			failed_event(j, j->last_error);
			record_own_failure(j, j->last_error);
			break;
		}
		if (j->lost[0]) { /* a static job cannot go on without a node, no job without its store */
			char what[600];
			/* c10d: what torch's agent raises there, for the tools
			 * that read its error file or events */
			snprintf(what, sizeof(what), "%s%s", j->store_gone && j->rdzv.c10d ?
				"RendezvousConnectionError: The connection to the C10d store has failed: " : "", j->lost);
			if (j->store_gone)
				failed_event(j, what); /* torch's agent raised */
			else
				end_events(j, true);
			fprintf(stderr, "dptp-run: error: %s; the job failed\n", j->lost);
			record_own_failure(j, what);
			break;
		}
		if (j->restart_count < o->max_restarts) {
			unsigned left = o->max_restarts - j->restart_count;
			if (j->info_log)
				logmsg('I', "[%s] Worker group FAILED. %u/%u attempts left; will restart worker group", o->role, left,
					o->max_restarts);
			free_workers(j);
			pmix_srv_deregister_job(&j->srv); /* the next attempt gets a new nspace */
			j->restart_count++;
			continue;
		}
		report_job_failed(j);
		break;
	}
	return status;
}

/* Releases what job_setup() made, in order; a death signal that torch had
 * no handler for yet (status < 0) is re-raised. Returns the exit status. */
static int job_end(struct job *j, int status)
{
	free_workers(j);
	phase("workers freed");
	if (status == 0)
		pmix_srv_finalize(&j->srv);
	else
		pmix_srv_abandon(&j->srv);
	phase("pmix server finalized");
	/* only now: a launcher killed before its folders are gone (up to 3 s
	 * in pmix_srv_abandon) still has its guard remove them */
	guard_stop(&j->guard);
	if (j->rdzv.ops)
		j->rdzv.ops->shutdown(&j->rdzv);
	logs_dirs_release(&j->logs);
	numa_plan_release(&j->numa);
	events_release(&j->ev);
	logs_filters_release(&j->dup[0]);
	logs_filters_release(&j->dup[1]);
	env_command_release(&j->cmd);
	if (j->sigfd >= 0)
		close(j->sigfd);
	if (j->rdzv_sigfd >= 0)
		close(j->rdzv_sigfd);
	phase("finalized");
	if (status < 0) { /* torch had no handler yet: the signal's own end */
		audit_abandon(j->o->audit); /* no report follows: its temporary folder goes */
		sigset_t one;
		signal(-status, SIG_DFL);
		sigemptyset(&one);
		sigaddset(&one, -status);
		raise(-status);
		sigprocmask(SIG_UNBLOCK, &one, NULL);
		return 128 - status;
	}
	return status;
}

int supervise_run(const struct run_opts *o)
{
	struct job j = {.o = o, .n = o->nproc, .sigfd = -1, .rdzv_sigfd = -1, .dup_fd = {-1, -1}};
	struct run_opts_env env;
	const char *bad;
	int status;

	t_start = dptp_now();
	timing = getenv("DPTP_RUN_TIMING") != NULL;
	if (run_opts_env_read(&env, &bad) < 0) {
		fprintf(stderr, "dptp-run: error: invalid %s '%s'\n", bad, getenv(bad));
		return 2;
	}
	j.stop_timeout = env.stop_timeout;
	j.barrier_timeout = env.barrier_timeout;
	j.info_log = env.info_log;
	if ((status = check_logs_specs(&j)) != 0)
		return status;
	if (take_signals(&j) < 0)
		return 1;
	if ((status = job_setup(&j)) == 0)
		status = run_attempts(&j);
	return job_end(&j, status);
}
