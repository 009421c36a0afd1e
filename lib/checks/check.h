/* Checks as small parts with one driver (after nccl-tests' struct testColl).
 *
 * A check supplies what it needs of the layout (skip), its inputs (prepare),
 * its collective step (run) and its verification (verify); the driver,
 * dptp_check_run(), does the rest: the watchdog (the exchange deadline), the
 * lockstep sharing of a failed preparation, timing, and the result.
 *
 * A new check is a new file in lib/checks/ (listed in its meson.build) and
 * one row in lib/checks/registry.c, the one list of check names. */
#ifndef DPTP_LIB_CHECKS_CHECK_H
#define DPTP_LIB_CHECKS_CHECK_H

#include "report/report.h"

/* --checks takes a bit mask: at most this many checks (registry.c asserts). */
#define DPTP_MAX_CHECKS 32

struct dptp_ctx;

struct dptp_check {
	const char *name;     /* the CLI and report name (DESIGN.md) */
	const char *summary;  /* one line for --list */
	const char *mech;     /* mechanism code(s) of reference/FAMILY.md it tests: "G", "C,I" */

	/* Optional. NULL when this layout has something to test, else why
	 * not (the `skip` detail). Must give the same answer on every rank. */
	const char *(*skip)(const struct dptp_ctx *c);

	/* Bytes of per-run state, zeroed by the driver and passed to every step. */
	size_t state_size;

	/* Optional. Local inputs: allocations and seed-derived data, no
	 * collectives. Returns 0 or a negative errno with a message in err;
	 * the driver shares the outcome across the world so that either every
	 * rank goes on to run or none does. */
	int (*prepare)(struct dptp_ctx *c, void *state, struct dptp_err *err);

	/* Number of run/verify rounds (0 means 1). */
	int rounds;
	/* The collective step of one round: every rank makes the same sequence
	 * of collective calls whatever it finds (lockstep). Records what it got
	 * in state; a call that fails goes into res (dptp_result_fail). */
	void (*run)(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res);
	/* Optional. Local: compares what run got with the reference and sets
	 * the status and detail. The driver stops after the first round that
	 * leaves res at `fail` or worse. */
	void (*verify)(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res);

	/* Optional. Frees what prepare and run left in state; always called. */
	void (*release)(struct dptp_ctx *c, void *state);
};

/* The registry, in report order. */
extern const struct dptp_check *const dptp_checks[];
extern const int dptp_nchecks;

/* Name -> index into dptp_checks, or -1. */
int dptp_check_lookup(const char *name);
/* Index -> name, or NULL. */
const char *dptp_check_name(int id);

/* The driver. Collective: runs check k on every rank in lockstep, with the
 * exchange deadline `timeout` seconds away, and fills res (name, status,
 * detail -- never NULL afterwards -- and seconds). After a timeout that
 * broke lockstep (c->x.broken), later checks are `skip`, not run. */
void dptp_check_run(const struct dptp_check *k, struct dptp_ctx *c, double timeout,
		    struct dptp_check_result *res);

/* Collective over the world: shares the outcome rc (0 or a negative errno,
 * message in err) of a step every rank made, so that every rank knows when
 * one failed. On a rank whose step failed, res becomes `error` ("what:
 * message"; a deadline `timeout`) unless it already holds a verdict of
 * `fail` or worse; on the others `error` whatever it held, "lead: global rank r
 * could not could_not (strerror)": what they compared came from no
 * exchange. The driver uses it for a failed preparation. */
void dptp_check_share_outcome(struct dptp_ctx *c, int rc, const struct dptp_err *err, const char *what,
			      const char *lead, const char *could_not, struct dptp_check_result *res);

/* Sets status and a printf-style detail (replacing any earlier one). */
void dptp_result_set(struct dptp_check_result *r, enum dptp_status s, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Records a failure from a negative errno: -ETIMEDOUT is `timeout`, anything
 * else `as`; keeps the first problem only. */
void dptp_result_fail(struct dptp_check_result *r, enum dptp_status as, int rc,
		      const struct dptp_err *err, const char *what);
/* Appends a printf-style tail to the detail. */
void dptp_result_append(struct dptp_check_result *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
#endif
