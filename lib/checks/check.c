/* The check driver and the result helpers (see check.h). */
#include "checks/check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/ctx.h"

int dptp_check_lookup(const char *name)
{
	for (int i = 0; i < dptp_nchecks; i++)
		if (strcmp(dptp_checks[i]->name, name) == 0)
			return i;
	return -1;
}

const char *dptp_check_name(int id)
{
	return id >= 0 && id < dptp_nchecks ? dptp_checks[id]->name : NULL;
}

void dptp_check_share_outcome(struct dptp_ctx *c, int rc, const struct dptp_err *err, const char *what,
			      const char *lead, const char *could_not, struct dptp_check_result *res)
{
	struct dptp_err xerr = {0};
	int32_t mine = rc < 0 ? rc : 0;
	int32_t *all = calloc((size_t)c->layout.world, sizeof(int32_t));
	int xrc = all ? dptp_xchg_allgather(&c->x, &c->world, &mine, sizeof(mine), all, &xerr) : -ENOMEM;
	if (rc < 0) {
		dptp_result_fail(res, DPTP_ERROR, rc, err, what);
	} else if (xrc < 0) {
		char w[128];
		snprintf(w, sizeof(w), "sharing the outcome of %s", what);
		dptp_result_fail(res, DPTP_ERROR, xrc, &xerr, w);
	}
	for (int r = 0; rc == 0 && xrc == 0 && r < c->layout.world; r++)
		if (all[r] < 0) {
			/* replaces any verdict: what this rank compared is no exchange */
			dptp_result_set(res, DPTP_ERROR, "%s: global rank %d could not %s (%s)", lead, r, could_not,
					strerror(-all[r]));
			break;
		}
	free(all);
}

void dptp_check_run(const struct dptp_check *k, struct dptp_ctx *c, double timeout,
		    struct dptp_check_result *res)
{
	snprintf(res->name, sizeof(res->name), "%s", k->name);
	const char *why = NULL;
	if (c->x.broken)
		why = "not run: an earlier check timed out";
	else if (k->skip)
		why = k->skip(c);
	if (why) {
		dptp_result_set(res, DPTP_SKIP, "%s", why);
		return;
	}
	c->x.deadline = dptp_now() + timeout;
	double t0 = dptp_now();
	unsigned long foreign0 = __atomic_load_n(&c->foreign.count, __ATOMIC_RELAXED);
	res->status = DPTP_PASS;
	void *state = k->state_size ? calloc(1, k->state_size) : NULL;
	struct dptp_err err = {0};
	int prc = 0;
	if (k->state_size && !state)
		prc = dptp_err_set(&err, -ENOMEM, "out of memory for the check's state");
	else if (k->prepare)
		prc = k->prepare(c, state, &err);
	if (k->prepare || prc < 0)
		dptp_check_share_outcome(c, prc, &err, "preparing the inputs", "not run", "prepare its inputs", res);
	int rounds = k->rounds > 0 ? k->rounds : 1;
	for (int round = 0; res->status < DPTP_FAIL && round < rounds; round++) {
		k->run(c, state, round, res);
		if (k->verify)
			k->verify(c, state, round, res);
	}
	if (k->release && state)
		k->release(c, state);
	free(state);
	res->seconds = dptp_now() - t0;
	if (!res->detail)
		res->detail = strdup("");
	unsigned long foreign = __atomic_load_n(&c->foreign.count, __ATOMIC_RELAXED) - foreign0;
	if (foreign)
		dptp_result_append(res, "%s%lu datagrams from outside the job dropped (last from pid %ld, uid %ld)",
				   res->detail[0] ? "; " : "", foreign, (long)c->foreign.pid, (long)c->foreign.uid);
}

void dptp_result_set(struct dptp_check_result *r, enum dptp_status s, const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	free(r->detail);
	r->detail = strdup(buf);
	r->status = s;
}

void dptp_result_fail(struct dptp_check_result *r, enum dptp_status as, int rc,
		      const struct dptp_err *err, const char *what)
{
	if (r->status >= DPTP_FAIL)
		return;
	/* a deadline is a timeout; a name squatted from outside the job is an
	 * error of the environment, never a finding of the check */
	enum dptp_status s = rc == -ETIMEDOUT ? DPTP_TIMEOUT : rc == -ENOTUNIQ ? DPTP_ERROR : as;
	dptp_result_set(r, s, "%s: %s", what, err && err->msg[0] ? err->msg : strerror(-rc));
}

void dptp_result_append(struct dptp_check_result *r, const char *fmt, ...)
{
	char tail[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(tail, sizeof(tail), fmt, ap);
	va_end(ap);
	char *d = NULL;
	if (asprintf(&d, "%s%s", r->detail ? r->detail : "", tail) >= 0) {
		free(r->detail);
		r->detail = d;
	}
}
