/* The job: attempts of the worker group, supervised like torchrun's agent. */
#ifndef DPTP_LAUNCHER_SUPERVISE_H
#define DPTP_LAUNCHER_SUPERVISE_H

#include "cli/run_opts.h"

/* Runs the job described by o until it succeeds, fails for good or is
 * signalled. Returns the launcher's exit status (0, or 1). */
int supervise_run(const struct run_opts *o);

#endif
