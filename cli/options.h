/* dptp-check's command line: one option table that generates getopt_long's
 * struct option[], the optstring and --help. */
#ifndef DPTP_CLI_OPTIONS_H
#define DPTP_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/dtype.h"
#include "base/fault.h"
#include "report/report.h"
#include "base/util.h"

/* Exit codes (DESIGN.md). */
enum { EXIT_PASS = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_ENV = 3, EXIT_TIMEOUT = 4 };

enum dptp_backend_choice { DPTP_BACKEND_AUTO, DPTP_BACKEND_HOST, DPTP_BACKEND_CUDA };

/* One bit per check, in the order of the registry (lib/checks/registry.c). */
typedef uint32_t dptp_check_set;

struct dptp_options {
	int dp, pp, tp;              /* 0 = not given (derive) */
	dptp_check_set checks;       /* default: all */
	dptp_fault_set inject;       /* default: none */
	enum dptp_backend_choice backend;
	enum dptp_dtype dtype;       /* default bf16 */
	int tokens;                  /* default 128 */
	int hidden;                  /* default 4096, multiple of 8 */
	uint64_t seed;               /* default 1 */
	double timeout;              /* seconds, default 60 */
	double eps;                  /* RMSNorm epsilon, default 1e-6 */
	enum dptp_format format;     /* default text */
	const char *output;          /* NULL: stdout */
	const char *layouts;         /* --layouts: "all" or "DPxPPxTP,..."; NULL: one layout */
	bool bench;
	bool list;
	int verbose;
	bool version;
	bool help;
};

/* Fills defaults. */
void dptp_options_init(struct dptp_options *o);

/* Parses argv. Returns 0 on success, or -EINVAL with err set to one line
 * naming the bad argument (the caller prints "dptp-check: <msg>" and exits
 * 2). Does not print, does not exit. Resets getopt state, so it can be
 * called repeatedly (tests do). */
int dptp_options_parse(struct dptp_options *o, int argc, char **argv, struct dptp_err *err);

/* --layouts: "all" (every (dp, pp, tp) with dp*pp*tp = world, dp
 * descending, then pp) or "DPxPPxTP,...". Fills out[] (room for max) and *n.
 * world 0 checks the syntax only; otherwise each listed layout must
 * multiply to world. Returns 0 or -EINVAL naming the bad part. */
int dptp_layouts_parse(const char *s, int world, int (*out)[3], int max, int *n, struct dptp_err *err);
#define DPTP_MAX_LAYOUTS 64

/* --help text, generated from the option table. */
void dptp_options_usage(FILE *f);

/* Colour on fd: only a terminal that is the user's, and NO_COLOR unset.
 * Under mpirun a rank's stdout is Open MPI's relay pty even when mpirun's
 * own output goes to a file, so ranks of an Open MPI job get no colour. */
bool dptp_use_colour(int fd);

#endif
