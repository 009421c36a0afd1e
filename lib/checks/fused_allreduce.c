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

/* Full-size: the inputs and outputs of the code under test. Block-size
 * (blk elements, whole rows): the reference, made and compared a block
 * of rows at a time so that it stays in cache. */
struct bufs {
	void *arena;  /* x, res_in, res_out, norm_out: one huge-page-friendly block */
	size_t arena_bytes;
	void *x, *res_in, *gamma, *res_out, *norm_out;
	size_t blk;
	void *ref_res, *ref_norm, *peer_x;
	float *sum;
	void *all_x; /* the data-plane path's allreduced x, full size, when taken */
};

static void free_bufs(struct bufs *b)
{
	dptp_big_free(b->arena, b->arena_bytes);
	free(b->gamma);
	free(b->ref_res); free(b->ref_norm); free(b->peer_x); free(b->sum); free(b->all_x);
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

/* Compares m elements from element `first` of a round with the reference
 * block (the first wrong one is reported; the maxima cover every element):
 * residual_out bit for bit (as floats), norm_out within the dtype's
 * tolerance, never NaN. */
DPTP_HOT static void compare(struct dptp_ctx *c, struct bufs *b, size_t first, size_t m, int hidden, int it,
		    struct dptp_check_result *res, double *max_abs, double *max_rel)
{
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt);
	const double tol = tolerance(dt);
	float gr[1024], wr[1024], gn[1024], wn[1024];
	for (size_t base = 0; base < m; base += 1024) {
		size_t k_end = m - base < 1024 ? m - base : 1024;
		dptp_load_f32(gr, (char *)b->res_out + (first + base) * esz, k_end, dt);
		dptp_load_f32(wr, (char *)b->ref_res + base * esz, k_end, dt);
		dptp_load_f32(gn, (char *)b->norm_out + (first + base) * esz, k_end, dt);
		dptp_load_f32(wn, (char *)b->ref_norm + base * esz, k_end, dt);
		for (size_t k = 0; k < k_end; k++) {
			float got_r = gr[k], want_r = wr[k], got_n = gn[k], want_n = wn[k];
			double ar = fabs((double)got_r - want_r), an = fabs((double)got_n - want_n);
			double rn = an / (fabs((double)want_n) > 1e-3 ? fabs((double)want_n) : 1e-3);
			if (ar > *max_abs) *max_abs = ar;
			if (an > *max_abs) *max_abs = an;
			if (rn > *max_rel) *max_rel = rn;
			bool bad = got_r != want_r || !(rn <= tol) || isnan(got_n);
			if (bad && res->status < DPTP_FAIL) {
				size_t i = first + base + k;
				dptp_result_set(res, DPTP_FAIL,
					"call %d: first wrong element at rank %d, token %zu, column %zu: "
					"%s got %g, want %g (norm got %g, want %g)",
					it, c->rank, i / (size_t)hidden, i % (size_t)hidden,
					got_r != want_r ? "residual_out" : "norm_out", got_r, want_r, got_n, want_n);
			}
		}
	}
}

static int fused_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	struct bufs *b = &s->b;
	enum dptp_dtype dt = c->p.dtype;
	int hidden = c->p.hidden;
	size_t nmax = (size_t)c->p.tokens * (size_t)hidden, esz = dptp_dtype_bytes(dt);
	/* whole rows of about 16 K elements */
	b->blk = (size_t)(hidden < 16384 ? 16384 / hidden : 1) * (size_t)hidden;
	size_t each = (nmax * esz + 63) / 64 * 64;
	b->arena_bytes = 4 * each;
	if ((b->arena = dptp_big_alloc(b->arena_bytes))) {
		b->x = b->arena;
		b->res_in = (char *)b->arena + each;
		b->res_out = (char *)b->arena + 2 * each;
		b->norm_out = (char *)b->arena + 3 * each;
	}
	b->gamma = malloc((size_t)hidden * esz);
	b->ref_res = malloc(b->blk * esz);
	b->ref_norm = malloc(b->blk * esz); b->peer_x = malloc(b->blk * esz); b->sum = malloc(b->blk * sizeof(float));
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

/* residual + RMSNorm of an already allreduced x on this rank, into
 * res_out and norm_out, a block of rows at a time. */
static void local_norm(struct dptp_ctx *c, struct bufs *b, const void *sum_x, int tokens)
{
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt), hidden = (size_t)c->p.hidden, rows = b->blk / hidden;
	for (size_t r0 = 0; r0 < (size_t)tokens; r0 += rows) {
		size_t nr = (size_t)tokens - r0 < rows ? (size_t)tokens - r0 : rows, off = r0 * hidden * esz;
		dptp_load_f32(b->sum, (const char *)sum_x + off, nr * hidden, dt);
		dptp_residual_rmsnorm_ref(b->sum, (char *)b->res_in + off, b->gamma, (char *)b->res_out + off,
					  (char *)b->norm_out + off, (int)nr, (int)hidden, (float)c->p.eps, dt);
	}
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
		if (!b->all_x && !(b->all_x = malloc((size_t)c->p.tokens * (size_t)hidden * esz))) {
			dptp_result_set(res, DPTP_ERROR, "out of memory");
			return;
		}
		void *d = c->comm->ops->alloc(c->comm, n * esz);
		rc = d ? c->comm->ops->upload(c->comm, d, b->x, n * esz) : -ENOMEM;
		int arc2 = c->comm->ops->allreduce(c->comm, tp, d, rc == 0 ? n : 0, dt, &err);
		if (rc == 0 && arc2 == 0)
			rc = c->comm->ops->download(c->comm, b->all_x, d, n * esz);
		else if (rc == 0)
			rc = arc2;
		c->comm->ops->free(c->comm, d);
		if (rc < 0) {
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "data-plane allreduce");
			return;
		}
		local_norm(c, b, b->all_x, tokens);
		s->algo = "allreduce over the data plane";
	} else {
		/* TP 1: plain residual + RMSNorm */
		local_norm(c, b, b->x, tokens);
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
		/* the reference, from the seed alone: the members' inputs summed
		 * in group order in fp32, then residual + RMSNorm; a block of
		 * rows at a time, compared as it is made */
		size_t esz = dptp_dtype_bytes(dt), rows = b->blk / (size_t)hidden;
		for (size_t r0 = 0; r0 < (size_t)s->tokens; r0 += rows) {
			size_t nr = (size_t)s->tokens - r0 < rows ? (size_t)s->tokens - r0 : rows;
			size_t first = r0 * (size_t)hidden, m = nr * (size_t)hidden;
			memset(b->sum, 0, m * sizeof(float));
			for (int j = 0; j < tp->size; j++) {
				dptp_input_fill_at(b->peer_x, first, m, s->seed, (uint64_t)tp->ranks[j], dt);
				dptp_add_f32(b->sum, b->peer_x, m, dt);
			}
			dptp_residual_rmsnorm_ref(b->sum, (char *)b->res_in + first * esz, b->gamma, b->ref_res,
						  b->ref_norm, (int)nr, hidden, (float)c->p.eps, dt);
			compare(c, b, first, m, hidden, it, res, &s->max_abs, &s->max_rel);
		}
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
	.mech = "G",
	.state_size = sizeof(struct state),
	.prepare = fused_prepare,
	.rounds = ITERATIONS,
	.run = fused_run,
	.verify = fused_verify,
	.release = fused_release,
};
