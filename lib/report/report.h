/* Results and their writers: the text table for people, JSON for scripts
 * (schema in DESIGN.md, names are a contract), JUnit XML for CI.
 * Writers are pure functions of a struct dptp_report; gathering per-rank
 * results to rank 0 lives in lib/report/gather.c. */
#ifndef DPTP_LIB_REPORT_H
#define DPTP_LIB_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/util.h"

/* Ordered by severity: the worst status wins when ranks are merged. */
enum dptp_status {
	DPTP_SKIP = 0,
	DPTP_PASS = 1,
	DPTP_FAIL = 2,
	DPTP_ERROR = 3,
	DPTP_TIMEOUT = 4,
};

const char *dptp_status_name(enum dptp_status s);     /* "pass", ... */
int dptp_status_parse(const char *name);               /* -1 if unknown */
enum dptp_status dptp_status_worst(enum dptp_status a, enum dptp_status b);

struct dptp_check_result {
	char name[32];
	enum dptp_status status;
	double seconds;
	char *detail;     /* owned, "" when nothing to say; never NULL once set */
	const char *mech; /* static: the check's mechanism code(s) (FAMILY.md), NULL unknown */
};

struct dptp_replica_result {
	int dp;
	int nranks;
	int *ranks;       /* owned */
	enum dptp_status status; /* worst of its checks */
	size_t nchecks;
	struct dptp_check_result *checks; /* owned */
};

/* One row of --bench output. */
struct dptp_bench_row {
	int tp;
	int tokens;
	int hidden;
	char dtype[8];
	double fused_us;
	double unfused_us;
	double speedup;
	double fused_busbw_gbs;
	double unfused_busbw_gbs;
};

struct dptp_report {
	const char *tool;       /* "dptp-check" */
	const char *version;
	int world, dp, pp, tp;
	const char *backend;    /* "host" | "cuda" */
	const char *bootstrap;  /* "pmix" | "torchrun" | "single" */
	const char *engine;     /* "dptp-run" | "mpirun" | "srun" | "torchrun" | ... ; NULL omits */
	uint64_t seed;
	size_t ninject;
	const char *const *inject;  /* fault names */
	size_t nreplicas;
	struct dptp_replica_result *replicas;
	size_t nbench;              /* 0: no "bench" key */
	struct dptp_bench_row *bench;
};

struct dptp_summary {
	int pass, fail, skip, error, timeout;
};

/* Counts (replica, check) pairs. */
struct dptp_summary dptp_report_summary(const struct dptp_report *r);
/* Worst status over everything; DPTP_ERROR for a report without a single
 * (replica, check) pair: nothing checked is not a pass. */
enum dptp_status dptp_report_worst(const struct dptp_report *r);
/* Exit code of DESIGN.md: 0 pass/skip, 1 fail, 4 timeout, 3 error. */
int dptp_report_exit_code(const struct dptp_report *r);

enum dptp_format { DPTP_FORMAT_TEXT, DPTP_FORMAT_JSON, DPTP_FORMAT_JUNIT };

int dptp_report_write_text(const struct dptp_report *r, FILE *f, bool color, int verbose);
int dptp_report_write_json(const struct dptp_report *r, FILE *f);
int dptp_report_write_junit(const struct dptp_report *r, FILE *f);
int dptp_report_write(const struct dptp_report *r, enum dptp_format fmt, FILE *f,
		      bool color, int verbose);

/* Writes a regular or new file atomically: a temp file in the same folder
 * (a short name when the target's is near NAME_MAX), fsync, rename. An
 * existing non-regular target (character device, FIFO) and a descriptor path
 * (/dev/fd/N, /dev/stdout) are opened and written in place, never replaced;
 * a FIFO without a reader is waited for 10 s at most.
 * Returns 0 or -errno with a message naming the path. */
int dptp_report_write_file(const struct dptp_report *r, enum dptp_format fmt,
			   const char *path, struct dptp_err *err);
/* The same for any writer: emit(arg, f) writes the content (0 or a negative
 * errno). Used by dptp-check --layouts for its several reports. */
int dptp_write_file_with(const char *path, int (*emit)(void *arg, FILE *f), void *arg,
			 struct dptp_err *err);

/* Escapers, exposed for tests: append the escaped form of n bytes of s to a
 * FILE. JSON: every control byte as \u00XX, invalid UTF-8 as U+FFFD.
 * XML: &<>"' as entities, bytes not allowed in XML 1.0 (control bytes other
 * than tab/LF/CR, invalid UTF-8) as U+FFFD. */
void dptp_json_escape(FILE *f, const char *s, size_t n);
void dptp_xml_escape(FILE *f, const char *s, size_t n);

/* Frees everything a report owns (replicas and their checks); NULL-safe. */
void dptp_report_release(struct dptp_report *r);

#endif
