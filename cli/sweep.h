/* dptp-check --layouts: one job, every chosen (dp, pp, tp) layout. */
#ifndef DPTP_CLI_SWEEP_H
#define DPTP_CLI_SWEEP_H

#include "bootstrap/bootstrap.h"
#include "checks/ctx.h"
#include "options.h"

/* Shared with the one-layout run (check_main.c). */
size_t dptp_cli_run_checks(const struct dptp_options *o, struct dptp_ctx *c, struct dptp_check_result *res);
int dptp_cli_share_verdict(struct dptp_bootstrap *b, int code, bool broken, double wait);
void dptp_cli_fill_mech(struct dptp_report *rep);
/* Rank 0: the report to --output (and, for JSON or JUnit there, the text
 * table on stdout), or to stdout. Returns code, or 3 when the file could
 * not be written. */
int dptp_cli_write_report(const struct dptp_options *o, const struct dptp_report *rep, int code, bool colour);

/* Runs the checks over every layout of o->layouts, regrouping without a
 * relaunch (a context per layout, fresh exchange keys), gathers once, and
 * writes one report per layout plus the layout x replica matrix. Takes b
 * (destroys it). Returns the exit code. */
int dptp_check_sweep(const struct dptp_options *o, struct dptp_bootstrap *b, const struct dptp_params *p);

#endif
