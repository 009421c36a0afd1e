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

static void dispatch_run(struct dptp_ctx *c, struct dptp_check_result *res)
{
	struct dptp_err err = {0};
	enum dptp_dtype dt = c->p.dtype;
	size_t esz = dptp_dtype_bytes(dt), hidden = (size_t)c->p.hidden;
	int dp = c->layout.dp;
	size_t *cu = calloc((size_t)dp + 1, sizeof(size_t)); /* cumulative tokens per DP rank */
	if (!cu) {
		dptp_result_set(res, DPTP_ERROR, "out of memory");
		return;
	}
	for (int d = 0; d < dp; d++)
		cu[d + 1] = cu[d] + (size_t)tokens_of(c, d);
	size_t total = cu[dp] * hidden;
	struct dptp_comm *cm = c->comm;
	void *host = malloc(total * esz);
	void *buf = cm->ops->alloc(cm, total * esz);
	if (!host || !buf) {
		free(host);
		free(cu);
		dptp_result_set(res, DPTP_ERROR, "out of memory for %zu dispatched elements", total);
		return;
	}
	res->status = DPTP_PASS;
	/* "uninitialised": what a fresh allocation may hold -- here a NaN
	 * pattern, so garbage can never pass for tokens */
	memset(host, 0xff, total * esz);
	int myd = c->me.dp;
	/* the reference: every replica's tokens, from the seed alone */
	void *want = malloc(total * esz);
	if (!want) {
		free(host);
		cm->ops->free(cm, buf);
		free(cu);
		dptp_result_set(res, DPTP_ERROR, "out of memory for %zu dispatched elements", total);
		return;
	}
	for (int d = 0; d < dp; d++)
		fill_tokens(c, d, (char *)want + cu[d] * hidden * esz, (size_t)tokens_of(c, d) * hidden);
	memcpy((char *)host + cu[myd] * hidden * esz, (char *)want + cu[myd] * hidden * esz,
	       (size_t)tokens_of(c, myd) * hidden * esz);
	cm->ops->upload(cm, buf, host, total * esz);

	/* multicast: slice idx comes from root idx of the DP group (the bug:
	 * of the EP group, whose member idx is another replica's rank) */
	bool ep_bug = dptp_fault_on(c->p.faults, DPTP_FAULT_DISPATCH_EP_GROUP);
	const struct dptp_group *g = ep_bug ? &c->ep : &c->dp;
	for (int idx = 0; idx < dp; idx++) {
		char *slice = (char *)buf + cu[idx] * hidden * esz;
		size_t bytes = (size_t)tokens_of(c, idx) * hidden * esz;
		int rc = cm->ops->bcast(cm, g, slice, bytes, idx, &err);
		if (rc < 0)
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "dispatch broadcast");
	}
	/* which dispatched slices hold another replica's tokens or garbage */
	cm->ops->download(cm, host, buf, total * esz);
	char bad[512] = "";
	size_t off = 0;
	for (int d = 0; d < dp; d++) {
		size_t o = cu[d] * hidden * esz, nb = (size_t)tokens_of(c, d) * hidden * esz;
		if (memcmp((char *)host + o, (char *)want + o, nb) != 0 && off < sizeof(bad))
			off += (size_t)snprintf(bad + off, sizeof(bad) - off, "%s%d", off ? ", " : "", d);
	}

	/* combine: each EP rank applies its expert, all-reduce over EP, keep
	 * my DP range */
	int ep_index = dptp_group_index_of(&c->ep, c->rank);
	for (size_t i = 0; i < total; i++)
		dptp_store_elt(host, i, dptp_load_elt(host, i, dt) * expert_weight(ep_index), dt);
	cm->ops->upload(cm, buf, host, total * esz);
	int rc = cm->ops->allreduce(cm, &c->ep, buf, total, dt, &err);
	if (rc < 0)
		dptp_result_fail(res, DPTP_FAIL, rc, &err, "combine all-reduce over EP");
	cm->ops->download(cm, host, buf, total * esz);
	float wsum = 0;
	for (int j = 0; j < c->ep.size; j++)
		wsum += expert_weight(j);
	size_t wrong = 0, first = 0;
	float got0 = 0, want0 = 0;
	const void *want_buf = want;
	for (size_t i = 0; rc == 0 && i < (size_t)tokens_of(c, myd) * hidden; i++) {
		/* the sum of exact products, rounded once to dt as the all-reduce does */
		uint32_t r[1];
		dptp_store_elt(r, 0, dptp_load_elt(want_buf, cu[myd] * hidden + i, dt) * wsum, dt);
		float expect = dptp_load_elt(r, 0, dt);
		float got = dptp_load_elt(host, cu[myd] * hidden + i, dt);
		if (!(got == expect)) {
			if (!wrong++) {
				first = i;
				got0 = got;
				want0 = expect;
			}
		}
	}
	if (rc == 0 && wrong && res->status < DPTP_FAIL)
		dptp_result_set(res, DPTP_FAIL,
			"replica %d's combined tokens are wrong: %zu of %zu elements, first at token %zu column %zu "
			"(got %g, want %g); dispatched slices wrong on this rank: [%s] (broadcast on the %s group)",
			myd, wrong, (size_t)tokens_of(c, myd) * hidden, first / hidden, first % hidden, got0, want0,
			bad, ep_bug ? "EP" : "DP");
	else if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "%zu tokens of %d replicas dispatched, combined over EP %d; own %d tokens right%s%s%s",
				cu[dp], dp, c->ep.size, tokens_of(c, myd), *bad ? " (other replicas' slices wrong here: [" : "",
				bad, *bad ? "])" : "");
	cm->ops->free(cm, buf);
	free(want);
	free(host);
	free(cu);
}

const struct dptp_check dptp_check_dispatch = {
	.name = "dispatch",
	.summary = "naive MoE dispatch/combine returns each replica's own tokens",
	.run = dispatch_run,
};
