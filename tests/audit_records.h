/* The audit analysis's unit tests: a job's audit folder written by hand in
 * the contract's format (a<att>.p<pid>.<py|c>.jsonl, launcher.jsonl), and
 * the report of it. */
#ifndef DPTP_TESTS_AUDIT_RECORDS_H
#define DPTP_TESTS_AUDIT_RECORDS_H

#include <stdbool.h>
#include <stddef.h>

#include "audit/audit_analyze.h"

extern char arec_dir[64];
extern struct audit_report arec_rep;

int arec_setup(void **state);
int arec_teardown(void **state);
/* one line into attempt 0's file of pid (kind "py" or "c") */
__attribute__((format(printf, 3, 4)))
void arec(int pid, const char *kind, const char *fmt, ...);
__attribute__((format(printf, 1, 2)))
void arec_launcher(const char *fmt, ...);
/* a Python worker of rank r (pid 1000 + r) in world "h:29500" of size
 * world: hello (C and Python), world, and the DP2TP2 groups when world is 4 */
void arec_rank(int r, int world);
void arec_end(int r);
/* analyses the folder (hung_attempt -1: none); asserts it worked */
void arec_analyze(int hung_attempt);
void arec_release(void);
/* the number of findings of mechanism mech in world w */
size_t arec_count(size_t w, char mech);
/* a gap of world w (or of the job, w == SIZE_MAX) whose reason holds s */
bool arec_gap(size_t w, const char *s);
void arec_print(void);
/* a sanitizer's build: its shadow memory counts against RLIMIT_DATA */
bool arec_sanitized(void);
/* analyses the folder in a child under a data limit of mib MiB; asserts it
 * gave one world with nf findings and ngaps gaps there */
void arec_analyze_limited(int mib, size_t nf, size_t ngaps);
/* runs the group of n tests; its last `limited` ones (those under a data
 * limit) are left out of a sanitizer's build, whose shadow memory takes the
 * limit (meson counts cmocka's "not ok N # SKIP" as a failure) */
struct CMUnitTest;
int arec_run(const struct CMUnitTest *tests, size_t n, size_t limited);

#endif
