/* dptp-run --audit: the recorders put into the workers, the hang watch,
 * the report after the job (the analysis is audit_analyze.h). */
#ifndef DPTP_LAUNCHER_AUDIT_H
#define DPTP_LAUNCHER_AUDIT_H

#include <stdbool.h>
#include <stdio.h>

#include "base/util.h"

struct audit;

/* The audit options as given on the command line (cli/run_opts.c fills them). */
struct audit_opts {
	bool on;
	const char *layout; /* "DPxPPxTP" or NULL */
	const char *output; /* FILE or NULL */
	const char *format; /* text | json | junit, NULL: json */
	const char *hang;   /* seconds, NULL: 30 */
};

/* Validates the options and finds the recorders. Returns 0 with *out set
 * (NULL when --audit is off), or -EINVAL with a one-line message in err
 * naming the bad value. */
int audit_create(struct audit **out, const struct audit_opts *o, struct dptp_err *err);
/* The job's run directory is known (NULL: --log-dir /dev/null, a folder of
 * our own then): makes <run_dir>/audit, puts the recorders into the
 * environment the workers inherit, starts the hang watch. */
int audit_job_start(struct audit *a, const char *run_dir, struct dptp_err *err);
/* After the job: stops the watch, analyses the records, prints the table
 * on errs, writes --audit-output. Returns dptp-run's exit status: the
 * job's own when non-zero, else 1 with a finding, else 0. */
int audit_finish(struct audit *a, int job_status, FILE *errs);
void audit_destroy(struct audit *a);

#endif
