/* dptp-run --audit: the recorders put into the workers, the launcher's own
 * records (launcher.jsonl: worker starts and exits, hangs), the hang watch,
 * the report after the job (the analysis is audit_analyze.h). */
#ifndef DPTP_LAUNCHER_AUDIT_H
#define DPTP_LAUNCHER_AUDIT_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "base/util.h"

struct audit;

/* The audit options as given on the command line (cli/run_opts.c fills them). */
struct audit_opts {
	bool on;
	bool keep;          /* --audit-keep: the records' temporary folder stays */
	const char *layout; /* "DPxPPxTP" or NULL */
	const char *output; /* FILE, "-" (stdout) or NULL */
	const char *format; /* text | json | junit, NULL: json (text on stderr only without --audit-output) */
	const char *hang;   /* seconds, "0": off, NULL: torch's process-group timeout */
	const char *log_dir; /* --log-dir as given (NULL, "/dev/null" or a folder) */
	unsigned world;     /* the job's world size when fixed at start (nnodes fixed), else 0 */
};

/* Validates the options (a creatable --audit-output, a strict layout that
 * fits a known world) and finds the recorders. Returns 0 with *out set
 * (NULL when --audit is off), or -EINVAL with a one-line message in err
 * naming the bad value. Nothing is left on disk. */
int audit_create(struct audit **out, const struct audit_opts *o, struct dptp_err *err);
/* The job's run directory is known (NULL: --log-dir /dev/null): makes the
 * records' folder (<run_dir>/audit with --log-dir, else a temporary one),
 * opens launcher.jsonl, puts the recorders into the environment the workers
 * inherit, starts the hang watch. nworkers: this node's workers per attempt. */
int audit_job_start(struct audit *a, const char *run_dir, unsigned nworkers, struct dptp_err *err);
/* From the supervisor (NULL a: no-ops): a worker started, a worker reaped
 * (status as waitpid's). att is the restart count. */
void audit_worker_started(struct audit *a, int rank, int local_rank, pid_t pid, unsigned att);
void audit_worker_exited(struct audit *a, int rank, pid_t pid, unsigned att, int wstatus);
/* After the job: stops the watch, analyses the records of every attempt,
 * prints the table on errs, writes the report (--audit-output, or stdout
 * with --audit-format alone). Returns dptp-run's exit status: the job's own
 * when non-zero, else 1 with a finding, else 5 when the records are
 * incomplete, else 0. */
int audit_finish(struct audit *a, int job_status, FILE *errs);
/* The launcher dies of a signal before any report: the records'
 * temporary folder goes now (unless --audit-keep); audit_finish() then has
 * nothing to report. */
void audit_abandon(struct audit *a);
/* Removes the temporary records folder (unless --audit-keep). */
void audit_destroy(struct audit *a);

#endif
