/* dispatch: vLLM's naive MoE all2all. Dispatch ("naive multicast"): an
 * uninitialised buffer of every DP rank's tokens, own slice copied in, one
 * broadcast per DP index from group-local root idx -- on the DP group.
 * Combine: all-reduce over the EP group of each rank's "expert" output,
 * then each rank keeps its own DP slice. Tokens are identical on every rank
 * of a TP group, as activations are. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"

/* Tokens of DP replica d: uneven on purpose, as real batches are. */
static int tokens_of(const struct dptp_ctx *c, int d)
{
	return c->p.tokens + d;
}

/* Replica d's tokens, the same on every rank of its TP groups. */
static void fill_tokens(const struct dptp_ctx *c, int d, void *p, size_t n)
{
	dptp_input_fill(p, n, c->p.seed, 0xd15ULL + (uint64_t)d, c->p.dtype);
}

/* Each EP rank's "expert": a weight of 1 or 2, so the combined sum is exact. */
static float expert_weight(int ep_index)
{
	return (float)(1 + ep_index % 2);
}

struct state {
	size_t *cu;        /* [dp + 1] cumulative tokens per DP rank */
	size_t total;      /* elements of the dispatch buffer */
	void *arena;       /* host, want, dispatched: one huge-page-friendly block */
	size_t arena_bytes;
	void *host, *buf;  /* host copy, data-plane buffer */
	void *want;        /* the reference: every replica's tokens */
	void *dispatched;  /* the buffer after dispatch, before combine */
	bool ep_bug;
	int rc;            /* of the combine */
	int crc;           /* the first failed copy to or from the data plane */
	const char *cwhat; /* which copy */
};

static void copy_rc(struct state *s, int rc, const char *what)
{
	if (rc < 0 && s->crc == 0) {
		s->crc = rc;
		s->cwhat = what;
	}
}

static int dispatch_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	size_t esz = dptp_dtype_bytes(c->p.dtype), hidden = (size_t)c->p.hidden;
	int dp = c->layout.dp;
	s->cu = calloc((size_t)dp + 1, sizeof(size_t));
	if (!s->cu)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (int d = 0; d < dp; d++)
		s->cu[d + 1] = s->cu[d] + (size_t)tokens_of(c, d);
	s->total = s->cu[dp] * hidden;
	size_t each = (s->total * esz + 63) / 64 * 64;
	s->arena_bytes = 3 * each;
	if ((s->arena = dptp_big_alloc(s->arena_bytes))) {
		s->host = s->arena;
		s->want = (char *)s->arena + each;
		s->dispatched = (char *)s->arena + 2 * each;
	}
	s->buf = c->comm->ops->alloc(c->comm, s->total * esz);
	if (!s->host || !s->want || !s->dispatched || !s->buf)
		return dptp_err_set(err, -ENOMEM, "out of memory for %zu dispatched elements", s->total);
	/* "uninitialised": what a fresh allocation may hold -- here a NaN
	 * pattern, so garbage can never pass for tokens */
	memset(s->host, 0xff, s->total * esz);
	for (int d = 0; d < dp; d++)
		fill_tokens(c, d, (char *)s->want + s->cu[d] * hidden * esz, (size_t)tokens_of(c, d) * hidden);
	int myd = c->me.dp;
	memcpy((char *)s->host + s->cu[myd] * hidden * esz, (char *)s->want + s->cu[myd] * hidden * esz,
	       (size_t)tokens_of(c, myd) * hidden * esz);
	return 0;
}

static void dispatch_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	struct dptp_err err = {0};
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt), hidden = (size_t)c->p.hidden, total = s->total;
	struct dptp_comm *cm = c->comm;
	/* the collectives below are made whatever a copy said (lockstep) */
	s->crc = 0;
	copy_rc(s, cm->ops->upload(cm, s->buf, s->host, total * esz), "uploading the dispatch buffer");

	/* multicast: slice idx comes from root idx of the DP group (the bug:
	 * of the EP group, whose member idx is another replica's rank) */
	s->ep_bug = dptp_fault_on(c->p.faults, DPTP_FAULT_DISPATCH_EP_GROUP);
	const struct dptp_group *g = s->ep_bug ? &c->ep : &c->dp;
	for (int idx = 0; idx < c->layout.dp; idx++) {
		char *slice = (char *)s->buf + s->cu[idx] * hidden * esz;
		size_t bytes = (size_t)tokens_of(c, idx) * hidden * esz;
		int rc = cm->ops->bcast(cm, g, slice, bytes, idx, &err);
		if (rc < 0)
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "dispatch broadcast");
	}
	copy_rc(s, cm->ops->download(cm, s->host, s->buf, total * esz), "downloading the dispatched tokens");
	memcpy(s->dispatched, s->host, total * esz);

	/* combine: each EP rank applies its expert, all-reduce over EP, keep
	 * my DP range */
	int ep_index = dptp_group_index_of(&c->ep, c->rank);
	const float w = expert_weight(ep_index);
	float blk[1024];
	for (size_t base = 0; base < total; base += 1024) {
		size_t m = total - base < 1024 ? total - base : 1024;
		char *p = (char *)s->host + base * esz;
		dptp_load_f32(blk, p, m, dt);
		for (size_t k = 0; k < m; k++)
			blk[k] *= w;
		dptp_store_f32(p, blk, m, dt);
	}
	copy_rc(s, cm->ops->upload(cm, s->buf, s->host, total * esz), "uploading the expert outputs");
	s->rc = cm->ops->allreduce(cm, &c->ep, s->buf, total, dt, &err);
	if (s->rc < 0)
		dptp_result_fail(res, DPTP_FAIL, s->rc, &err, "combine all-reduce over EP");
	copy_rc(s, cm->ops->download(cm, s->host, s->buf, total * esz), "downloading the combined tokens");
	/* a rank whose upload failed sent garbage to the others: every rank
	 * learns of a failed copy, and none calls what it got a finding */
	dptp_check_share_outcome(c, s->crc, NULL, s->crc ? s->cwhat : "copying to or from the device",
				 "no verdict", "copy its tokens to or from its device", res);
}

static void dispatch_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt), hidden = (size_t)c->p.hidden;
	int dp = c->layout.dp, myd = c->me.dp;
	const size_t *cu = s->cu;
	/* which dispatched slices hold another replica's tokens or garbage */
	char bad[512] = "";
	size_t off = 0;
	for (int d = 0; d < dp; d++) {
		size_t o = cu[d] * hidden * esz, nb = (size_t)tokens_of(c, d) * hidden * esz;
		if (memcmp((char *)s->dispatched + o, (char *)s->want + o, nb) != 0 && off < sizeof(bad))
			off += (size_t)snprintf(bad + off, sizeof(bad) - off, "%s%d", off ? ", " : "", d);
	}
	float wsum = 0;
	for (int j = 0; j < c->ep.size; j++)
		wsum += expert_weight(j);
	size_t wrong = 0, first = 0;
	float got0 = 0, want0 = 0;
	const size_t mine = (size_t)tokens_of(c, myd) * hidden, myoff = cu[myd] * hidden * esz;
	float exp_b[1024], got_b[1024];
	uint32_t rnd[1024];
	for (size_t base = 0; s->rc == 0 && base < mine; base += 1024) {
		size_t m = mine - base < 1024 ? mine - base : 1024;
		/* the sum of exact products, rounded once to dt as the all-reduce does */
		dptp_load_f32(exp_b, (char *)s->want + myoff + base * esz, m, dt);
		for (size_t k = 0; k < m; k++)
			exp_b[k] *= wsum;
		dptp_store_f32(rnd, exp_b, m, dt);
		dptp_load_f32(exp_b, rnd, m, dt);
		dptp_load_f32(got_b, (char *)s->host + myoff + base * esz, m, dt);
		for (size_t k = 0; k < m; k++) {
			if (!(got_b[k] == exp_b[k]) && !wrong++) {
				first = base + k;
				got0 = got_b[k];
				want0 = exp_b[k];
			}
		}
	}
	if (s->rc == 0 && wrong && res->status < DPTP_FAIL)
		dptp_result_set(res, DPTP_FAIL,
			"replica %d's combined tokens are wrong: %zu of %zu elements, first at token %zu column %zu "
			"(got %g, want %g); dispatched slices wrong on this rank: [%s] (broadcast on the %s group)",
			myd, wrong, (size_t)tokens_of(c, myd) * hidden, first / hidden, first % hidden, got0, want0,
			bad, s->ep_bug ? "EP" : "DP");
	else if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "%zu tokens of %d replicas dispatched, combined over EP %d; own %d tokens right%s%s%s",
				cu[dp], dp, c->ep.size, tokens_of(c, myd), *bad ? " (other replicas' slices wrong here: [" : "",
				bad, *bad ? "])" : "");
}

static void dispatch_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	if (s->buf)
		c->comm->ops->free(c->comm, s->buf);
	dptp_big_free(s->arena, s->arena_bytes);
	free(s->cu);
}

const struct dptp_check dptp_check_dispatch = {
	.name = "dispatch",
	.summary = "naive MoE dispatch/combine returns each replica's own tokens",
	.mech = "G",
	.state_size = sizeof(struct state),
	.prepare = dispatch_prepare,
	.run = dispatch_run,
	.verify = dispatch_verify,
	.release = dispatch_release,
};
