/* The check registry. Names are the CLI contract (DESIGN.md). */
#ifndef DPTP_LIB_CHECK_H
#define DPTP_LIB_CHECK_H

#include "report/report.h"

enum dptp_check_id {
	DPTP_CHECK_BROADCAST,
	DPTP_CHECK_OPID,
	DPTP_CHECK_DEVICE_MAP,
	DPTP_CHECK_FUSED_ALLREDUCE,
	DPTP_CHECK_DISPATCH,
	DPTP_NCHECKS,
};

struct dptp_ctx;

struct dptp_check {
	const char *name;
	const char *summary;
	/* Runs on every rank, in lockstep: every rank makes the same sequence
	 * of collective calls whatever it finds. Fills status and detail. */
	void (*run)(struct dptp_ctx *ctx, struct dptp_check_result *res);
};

extern const struct dptp_check *const dptp_checks[DPTP_NCHECKS];

/* Name -> id, or -1. */
int dptp_check_lookup(const char *name);
/* Id -> name, or NULL. Needs no check object (the CLI links only this). */
const char *dptp_check_name(int id);



/* Sets status and a printf-style detail (replacing any earlier one). */
void dptp_result_set(struct dptp_check_result *r, enum dptp_status s, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Records a failure from a negative errno: -ETIMEDOUT is `timeout`, anything
 * else `as`; keeps the first problem only. */
void dptp_result_fail(struct dptp_check_result *r, enum dptp_status as, int rc,
		      const struct dptp_err *err, const char *what);
#endif
