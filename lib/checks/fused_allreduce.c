/* fused-allreduce: allreduce + residual add + RMSNorm * gamma through the
 * IPC workspace (built with the exchange backend on the TP group) equals a
 * reference computed locally from the seed, on every rank. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "ipc/workspace.h"

#define ITERATIONS 3 /* every Lamport buffer once */

static int call_tokens(int tokens, int it)
{
	int t = it == 0 ? tokens : it == 1 ? tokens / 8 : tokens / 2;
	return t > 0 ? t : 1;
}

static void fill(void *p, size_t n, uint64_t seed, uint64_t stream, enum dptp_dtype dt)
{
	dptp_input_fill(p, n, seed, stream, dt);
}

static double tolerance(enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_BF16: return 1.0 / 128;
	case DPTP_DTYPE_FP16: return 1.0 / 1024;
	case DPTP_DTYPE_FP32: return 1e-5;
	}
	return 0;
}

struct bufs {
	void *x, *res_in, *gamma, *res_out, *norm_out, *ref_res, *ref_norm, *peer_x;
	float *sum;
};

static void free_bufs(struct bufs *b)
{
	free(b->x); free(b->res_in); free(b->gamma); free(b->res_out); free(b->norm_out);
	free(b->ref_res); free(b->ref_norm); free(b->peer_x); free(b->sum);
}

struct state {
	struct bufs b;
	void *ws;           /* from c->ws, the host or GPU workspace */
	const char *algo;
	bool use_ws;        /* through the IPC workspace */
	bool spans;         /* a TP group spans hosts: the data-plane path */
	bool produced;      /* this round's outputs are there to compare */
	int tokens;         /* this round's */
	uint64_t seed;
	double max_abs, max_rel;
};

/* Compares one round; returns true when right. */
static bool compare(struct dptp_ctx *c, struct bufs *b, size_t n, int hidden, int it,
		    struct dptp_check_result *res, double *max_abs, double *max_rel)
{
	enum dptp_dtype dt = c->p.dtype;
	bool ok = true;
	for (size_t i = 0; i < n; i++) {
		float got_r = dptp_load_elt(b->res_out, i, dt), want_r = dptp_load_elt(b->ref_res, i, dt);
		float got_n = dptp_load_elt(b->norm_out, i, dt), want_n = dptp_load_elt(b->ref_norm, i, dt);
		double ar = fabs((double)got_r - want_r), an = fabs((double)got_n - want_n);
		double rn = an / (fabs((double)want_n) > 1e-3 ? fabs((double)want_n) : 1e-3);
		if (ar > *max_abs) *max_abs = ar;
		if (an > *max_abs) *max_abs = an;
		if (rn > *max_rel) *max_rel = rn;
		bool bad = got_r != want_r || !(rn <= tolerance(dt)) || isnan(got_n);
		if (bad && ok) {
			ok = false;
			if (res->status < DPTP_FAIL)
				dptp_result_set(res, DPTP_FAIL,
					"call %d: first wrong element at rank %d, token %zu, column %zu: "
					"%s got %g, want %g (norm got %g, want %g)",
					it, c->rank, i / (size_t)hidden, i % (size_t)hidden,
					got_r != want_r ? "residual_out" : "norm_out", got_r, want_r, got_n, want_n);
		}
	}
	return ok;
}

static int fused_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	struct bufs *b = &s->b;
	enum dptp_dtype dt = c->p.dtype;
	int hidden = c->p.hidden;
	size_t nmax = (size_t)c->p.tokens * (size_t)hidden, esz = dptp_dtype_bytes(dt);
	b->x = malloc(nmax * esz); b->res_in = malloc(nmax * esz); b->gamma = malloc((size_t)hidden * esz);
	b->res_out = malloc(nmax * esz); b->norm_out = malloc(nmax * esz); b->ref_res = malloc(nmax * esz);
	b->ref_norm = malloc(nmax * esz); b->peer_x = malloc(nmax * esz); b->sum = malloc(nmax * sizeof(float));
	if (!b->x || !b->res_in || !b->gamma || !b->res_out || !b->norm_out || !b->ref_res || !b->ref_norm ||
	    !b->peer_x || !b->sum)
		return dptp_err_set(err, -ENOMEM, "out of memory for %d x %d tokens", c->p.tokens, hidden);
	fill(b->gamma, (size_t)hidden, c->p.seed, 0x6a33aULL, dt);
	s->algo = "one-shot (Lamport)";
	return 0;
}

/* Round 0's first part: the workspace, and whether the whole TP group has one. */
static void fused_setup(struct dptp_ctx *c, struct state *s, struct dptp_check_result *res)
{
	struct dptp_err err = {0};
	enum dptp_dtype dt = c->p.dtype;
	size_t nmax = (size_t)c->p.tokens * (size_t)c->p.hidden, esz = dptp_dtype_bytes(dt);
	const struct dptp_group *tp = &c->tp;
	/* the workspace is exchanged on the TP group -- or, under the
	 * world-workspace fault, on WORLD with rank = tp_rank, size = tp_size */
	bool world_ws = dptp_fault_on(c->p.faults, DPTP_FAULT_WORLD_WORKSPACE);
	const struct dptp_group *xg = world_ws ? &c->world : tp;
	int ws_rank = world_ws ? c->me.tp : tp->index, ws_size = tp->size;
	int rc = 0;
	/* the IPC workspace needs each TP group on one host; when any group
	 * spans hosts, every rank (lockstep) takes the data-plane path instead:
	 * allreduce through the bootstrap, then residual + RMSNorm locally */
	for (int r = 0; r < c->layout.world; r++)
		s->spans |= c->host_of[r] != c->host_of[r - r % c->layout.tp];
	s->use_ws = (tp->size > 1 || c->ws->alone) && !s->spans;
	if (s->use_ws) {
		rc = c->ws->create(&s->ws, &c->ipc, xg, ws_rank, ws_size, nmax * esz, dt, &err);
		if (rc < 0)
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "workspace");
	}
	/* the harness (not the code under test) asks whether the whole TP
	 * group has a workspace before running the kernel on it */
	int32_t ok = rc == 0, *oks = calloc((size_t)tp->size, sizeof(int32_t));
	int arc = dptp_xchg_allgather(&c->x, tp, &ok, sizeof(ok), oks, &err);
	if (arc < 0) {
		dptp_result_fail(res, DPTP_FAIL, arc, &err, "workspace status allgather");
		ok = 0;
	}
	for (int j = 0; ok && j < tp->size; j++)
		if (!oks[j]) {
			ok = 0;
			dptp_result_set(res, DPTP_FAIL, "workspace creation failed on group rank %d (global rank %d); "
					"the fused kernel would run on a broken workspace", j, tp->ranks[j]);
		}
	free(oks);
}

static void fused_run(struct dptp_ctx *c, void *state, int it, struct dptp_check_result *res)
{
	struct state *s = state;
	struct bufs *b = &s->b;
	struct dptp_err err = {0};
	enum dptp_dtype dt = c->p.dtype;
	int hidden = c->p.hidden;
	size_t esz = dptp_dtype_bytes(dt);
	const struct dptp_group *tp = &c->tp;
	s->produced = false;
	if (it == 0)
		fused_setup(c, s, res);
	if (res->status >= DPTP_FAIL)
		return;
	s->seed = c->p.seed + (uint64_t)it * 7919;
	/* batches change size from call to call, as decode batches do: a
	 * Lamport buffer must come back clean after a larger call */
	s->tokens = call_tokens(c->p.tokens, it);
	int tokens = s->tokens;
	size_t n = (size_t)tokens * (size_t)hidden;
	fill(b->x, n, s->seed, (uint64_t)c->rank, dt);
	fill(b->res_in, n, s->seed, 0x12e5ULL + (uint64_t)tp->ranks[0], dt);
	int rc;
	if (s->use_ws) {
		rc = c->ws->fused(s->ws, b->x, b->res_in, b->gamma, b->res_out, b->norm_out, tokens, hidden,
				  (float)c->p.eps, c->x.deadline, &s->algo, &err);
		if (rc < 0) {
			if (rc == -ETIMEDOUT)
				c->x.broken = true; /* a peer is gone: lockstep is lost */
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "fused allreduce");
			return;
		}
	} else if (s->spans) {
		/* a TP group spans hosts: no IPC workspace to test */
		void *d = c->comm->ops->alloc(c->comm, n * esz);
		rc = d ? c->comm->ops->upload(c->comm, d, b->x, n * esz) : -ENOMEM;
		int arc2 = c->comm->ops->allreduce(c->comm, tp, d, rc == 0 ? n : 0, dt, &err);
		if (rc == 0 && arc2 == 0)
			rc = c->comm->ops->download(c->comm, b->peer_x, d, n * esz);
		else if (rc == 0)
			rc = arc2;
		c->comm->ops->free(c->comm, d);
		if (rc < 0) {
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "data-plane allreduce");
			return;
		}
		for (size_t i = 0; i < n; i++)
			b->sum[i] = dptp_load_elt(b->peer_x, i, dt);
		dptp_residual_rmsnorm_ref(b->sum, b->res_in, b->gamma, b->res_out, b->norm_out, tokens, hidden,
					  (float)c->p.eps, dt);
		s->algo = "allreduce over the data plane";
	} else {
		/* TP 1: plain residual + RMSNorm */
		for (size_t i = 0; i < n; i++)
			b->sum[i] = dptp_load_elt(b->x, i, dt);
		dptp_residual_rmsnorm_ref(b->sum, b->res_in, b->gamma, b->res_out, b->norm_out, tokens, hidden,
					  (float)c->p.eps, dt);
	}
	s->produced = true;
}

/* The detail once the rounds are over (the last, or the first that failed). */
static void conclude(struct dptp_ctx *c, struct state *s, struct dptp_check_result *res)
{
	enum dptp_dtype dt = c->p.dtype;
	const struct dptp_group *tp = &c->tp;
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "%d calls (%d, %d, %d tokens) x %d %s, TP %d %s%s: max abs err %.3g, max rel err %.3g",
				ITERATIONS, call_tokens(c->p.tokens, 0), call_tokens(c->p.tokens, 1),
				call_tokens(c->p.tokens, 2), c->p.hidden, dptp_dtype_name(dt),
				tp->size, s->use_ws || s->spans ? s->algo : "(no allreduce)", s->spans ? "" : c->ws->place,
				s->max_abs, s->max_rel);
	if (res->status == DPTP_PASS && s->spans) {
		char gs[256];
		dptp_group_format(tp, gs, sizeof(gs));
		dptp_result_append(res, "; IPC workspace not tested: a TP group spans hosts (this one: %s%s)",
				   gs, c->host_of[tp->ranks[0]] != c->host_of[tp->ranks[tp->size - 1]] ? ", spans" : ", local");
	} else if (res->status == DPTP_FAIL && s->max_abs > 0) {
		dptp_result_append(res, "; max abs err %.3g, max rel err %.3g", s->max_abs, s->max_rel);
	}
}

static void fused_verify(struct dptp_ctx *c, void *state, int it, struct dptp_check_result *res)
{
	struct state *s = state;
	struct bufs *b = &s->b;
	enum dptp_dtype dt = c->p.dtype;
	int hidden = c->p.hidden;
	const struct dptp_group *tp = &c->tp;
	if (s->produced) {
		size_t n = (size_t)s->tokens * (size_t)hidden;
		/* the reference, from the seed alone: the members' inputs summed
		 * in group order in fp32 */
		memset(b->sum, 0, n * sizeof(float));
		for (int j = 0; j < tp->size; j++) {
			fill(b->peer_x, n, s->seed, (uint64_t)tp->ranks[j], dt);
			for (size_t i = 0; i < n; i++)
				b->sum[i] += dptp_load_elt(b->peer_x, i, dt);
		}
		dptp_residual_rmsnorm_ref(b->sum, b->res_in, b->gamma, b->ref_res, b->ref_norm, s->tokens, hidden,
					  (float)c->p.eps, dt);
		compare(c, b, n, hidden, it, res, &s->max_abs, &s->max_rel);
	}
	if (res->status >= DPTP_FAIL || it == ITERATIONS - 1)
		conclude(c, s, res);
}

static void fused_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	if (s->ws)
		c->ws->destroy(s->ws);
	free_bufs(&s->b);
}

const struct dptp_check dptp_check_fused_allreduce = {
	.name = "fused-allreduce",
	.summary = "allreduce + residual + RMSNorm through the IPC workspace equals the local reference",
	.state_size = sizeof(struct state),
	.prepare = fused_prepare,
	.rounds = ITERATIONS,
	.run = fused_run,
	.verify = fused_verify,
	.release = fused_release,
};
