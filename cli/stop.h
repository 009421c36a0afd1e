/* dptp-check's last words: the report on exit paths that have no results
 * to gather. A signal (SIGTERM: what dptp-run, torchrun and mpirun send to
 * the other workers when one dies; SIGINT; SIGHUP) during the start-up or
 * the checks, and a bootstrap that cannot start at all.
 *
 * The signal handler only writes the signal's number to a pipe. A thread
 * of its own reads it, builds the report from what the main thread has
 * registered here (under a lock), writes it and _exit()s: the main thread,
 * wherever it waits (a fence, a store, the data plane), is never needed,
 * so the process ends within milliseconds whatever it was doing. */
#ifndef DPTP_CLI_STOP_H
#define DPTP_CLI_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "bootstrap/bootstrap.h"
#include "options.h"
#include "report/report.h"

/* Installs the handlers (SIGTERM, SIGINT, SIGHUP) and their thread; blocks
 * those signals in the calling thread and so in every thread it creates
 * later (call it before any other thread exists). Borrows o for the rest of
 * the process. Returns 0 or a negative errno. */
int dptp_stop_init(const struct dptp_options *o, bool cuda);

/* What the main thread is doing, for the report a signal writes. */
void dptp_stop_booted(struct dptp_bootstrap *b);  /* rank and world known; b borrowed */
void dptp_stop_startup(void);                     /* learning the peers, the data plane */
/* The checks: res[0..ndone) are this rank's finished results (borrowed:
 * left unchanged until dptp_stop_claim), `current` the one running (NULL
 * between checks; static). */
void dptp_stop_checks(const struct dptp_check_result *res, size_t ndone, const char *current);
void dptp_stop_gather(void);                      /* gathering the results */
/* --layouts: writer writes the report in its own form (rank 0 of a run a
 * signal ends; under the lock, so the main thread is held where it is) from
 * its own results array, of which the first ndone are this rank's finished
 * results, the one after them running when `running`; `when` says what the
 * main thread was doing. Returns the exit code. */
typedef int (*dptp_stop_sweep_writer)(void *arg, int sig, const char *when, size_t ndone, bool running);
void dptp_stop_sweep(dptp_stop_sweep_writer writer, void *arg);
/* --layouts: the layout about to run starts at result `base` (the
 * layouts before it: base results, all finished). */
void dptp_stop_sweep_at(size_t base);
/* For a writer: rep (its head set) as a signal leaves layout lay (dp, pp,
 * tp) of world ranks: o's checks not run but res[0..ndone), this rank's,
 * and the one after them when running. Returns 0 or -ENOMEM. */
int dptp_stop_fill_layout(struct dptp_report *rep, const struct dptp_options *o, int world, const int lay[3],
			  int sig, const char *when, const struct dptp_check_result *res, size_t ndone, bool running);
void dptp_stop_bench(void);                       /* --bench */

/* The main thread is about to write the report itself: true, and a signal
 * from now on waits (10 s at most) for dptp_stop_done. false when a
 * signal's report is being written: the process is about to end, write
 * nothing. */
bool dptp_stop_claim(void);
/* The report is written (or was never this rank's to write); a signal now
 * ends the process with `code` at once. */
void dptp_stop_done(int code);

/* Whether this process may be rank 0 before the bootstrap said so: false
 * only when the environment names another rank (PMIX_RANK under a PMIx
 * launcher, else RANK; OMPI_COMM_WORLD_RANK, SLURM_PROCID). */
bool dptp_stop_maybe_rank0(void);

/* The report of a run that ends before any check could run: each selected
 * check (or "bench", with --bench; rows[nrows] are the bench rows that
 * were measured, borrowed) of each replica is `st` with `why` as its
 * detail. The layout is o's over `world` ranks when it fits, else one
 * replica of them all; world 0: a single-process report. b may be NULL.
 * Written as --output says (stdout without it). Returns `code`, or 3 when
 * the file could not be written. */
int dptp_stop_report_not_run(const struct dptp_options *o, const struct dptp_bootstrap *b, int world,
			     bool cuda, enum dptp_status st, const char *why, int code,
			     struct dptp_bench_row *rows, size_t nrows);

#endif
