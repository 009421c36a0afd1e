/* dptp-check --bench (cli/bench.c). */
#ifndef DPTP_CLI_BENCH_H
#define DPTP_CLI_BENCH_H

#include "bootstrap/bootstrap.h"
#include "checks/ctx.h"
#include "options.h"

/* Collective. Times the kernels on the context's GPUs, writes the report
 * (rank 0), releases c and b, and returns the exit code. */
int dptp_check_bench(const struct dptp_options *o, struct dptp_ctx *c, struct dptp_bootstrap *b);

#endif
