/* reduce-span: all-reduces over the TP group and over the DP group, on the
 * data plane, sum exactly their members' contributions (mechanism G of
 * reference/FAMILY.md, the variants bugs 1 and 5 do not cover).
 *
 * Every rank contributes a one-hot vector of world elements: 1 at its
 * global rank, 0 elsewhere. Any sum of them is exact in every dtype, and the
 * result names who contributed: element k is 1 exactly when global rank k
 * took part. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "plane/comm_nccl.h"

struct span {
	const struct dptp_group *want;  /* the group the reduction is meant for */
	const struct dptp_group *used;  /* the group it ran over */
	float *got;                     /* [world] */
	int rc;
	struct dptp_err err;
	int crc;                        /* a failed copy to or from the data plane */
};

struct state {
	struct dptp_group sub;          /* a strict subgroup of the TP group */
	struct span tp, dp;
	void *buf;
};

/* The group the TP reduction runs over: the TP group -- or, with
 * world-reduce, WORLD (the module fell back to the default group:
 * Megatron-LM issue 7452, transformers PR 48383); with subgroup-reduce, the
 * EP subgroup of the TP group split as moe_tp x moe_ep (the fused post-MoE
 * all-reduce that skipped the TP reduction: SGLang PR 32963). */
static const struct dptp_group *reduce_span_tp_group(struct dptp_ctx *c, struct state *s)
{
	if (dptp_fault_on(c->p.faults, DPTP_FAULT_WORLD_REDUCE))
		return &c->world;
	if (dptp_fault_on(c->p.faults, DPTP_FAULT_SUBGROUP_REDUCE))
		return &s->sub;
	return &c->tp;
}

/* The EP subgroup: moe_tp = 2 (tp even) or tp (odd), the members of my TP
 * group whose index is mine modulo moe_tp. A strict subgroup for tp >= 2. */
static int make_subgroup(const struct dptp_ctx *c, struct dptp_group *g)
{
	int tp = c->tp.size, moe_tp = tp % 2 == 0 ? 2 : tp;
	g->ranks = calloc((size_t)tp, sizeof(int));
	if (!g->ranks)
		return -ENOMEM;
	g->kind = DPTP_GROUP_TP;
	g->index = -1;
	for (int i = c->tp.index % moe_tp; i < tp; i += moe_tp) {
		if (c->tp.ranks[i] == c->rank)
			g->index = g->size;
		g->ranks[g->size++] = c->tp.ranks[i];
	}
	return 0;
}

static int reduce_span_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	size_t world = (size_t)c->layout.world;
	s->tp.got = calloc(world, sizeof(float));
	s->dp.got = calloc(world, sizeof(float));
	s->buf = c->comm->ops->alloc(c->comm, world * sizeof(float));
	if (!s->tp.got || !s->dp.got || !s->buf || make_subgroup(c, &s->sub) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	return 0;
}

static void reduce_on(struct dptp_ctx *c, struct state *s, struct span *sp)
{
	struct dptp_comm *cm = c->comm;
	size_t world = (size_t)c->layout.world;
	memset(sp->got, 0, world * sizeof(float));
	sp->got[c->rank] = 1.0f;
	if (sp->used == &s->sub && dptp_comm_is_nccl(cm)) {
		/* every rank takes this branch alike: lockstep holds */
		sp->rc = dptp_err_set(&sp->err, -ENOTSUP, "the NCCL data plane has no communicator for a TP subgroup "
				      "(run subgroup-reduce on the host or staged data plane)");
		return;
	}
	sp->crc = cm->ops->upload(cm, s->buf, sp->got, world * sizeof(float));
	/* called whatever upload said: the all-reduce is collective */
	sp->rc = cm->ops->allreduce(cm, sp->used, s->buf, world, DPTP_DTYPE_FP32, &sp->err);
	if (sp->rc == 0 && sp->crc == 0)
		sp->crc = cm->ops->download(cm, sp->got, s->buf, world * sizeof(float));
}

static void reduce_span_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	s->tp.want = &c->tp;
	s->tp.used = reduce_span_tp_group(c, s);
	s->dp.want = s->dp.used = &c->dp;
	reduce_on(c, s, &s->tp);
	reduce_on(c, s, &s->dp);
	/* a rank whose upload failed put garbage into the sums: every rank
	 * learns of a failed copy, and none calls what it got a finding */
	dptp_check_share_outcome(c, s->tp.crc < 0 ? s->tp.crc : s->dp.crc, NULL,
				 "copying a contribution to or from the device", "no verdict",
				 "copy its contribution to or from its device", res);
}

/* Appends "a, b, c" (at most 8, then "...") of the ranks whose element is
 * `present` != whether they belong to g. */
static int list_diff(const struct dptp_ctx *c, const struct span *sp, bool missing, char *out, size_t n)
{
	int count = 0;
	size_t off = 0;
	out[0] = 0;
	for (int r = 0; r < c->layout.world; r++) {
		bool member = dptp_group_index_of(sp->want, r) >= 0;
		bool there = sp->got[r] == 1.0f;
		bool odd = sp->got[r] != 0.0f && sp->got[r] != 1.0f;
		if (!(missing ? member && !there : (!member && there) || odd))
			continue;
		if (count < 8 && off < n)
			off += (size_t)snprintf(out + off, n - off, "%s%d", count ? ", " : "", r);
		else if (count == 8 && off < n)
			off += (size_t)snprintf(out + off, n - off, ", ...");
		count++;
	}
	return count;
}

static void check_span(struct dptp_ctx *c, const struct span *sp, struct dptp_check_result *res)
{
	const char *kind = dptp_group_kind_name(sp->want->kind);
	char gs[256], used[256], miss[128], extra[128];
	dptp_group_format(sp->want, gs, sizeof(gs));
	if (sp->rc < 0) {
		char what[300];
		snprintf(what, sizeof(what), "%s all-reduce over %s", kind, gs);
		dptp_result_fail(res, sp->rc == -ENOTSUP ? DPTP_ERROR : DPTP_FAIL, sp->rc, &sp->err, what);
		return;
	}
	if (sp->crc < 0)
		return; /* no sum to look at: run made the result `error` */
	int nm = list_diff(c, sp, true, miss, sizeof(miss));
	int ne = list_diff(c, sp, false, extra, sizeof(extra));
	if ((nm || ne) && res->status < DPTP_FAIL) {
		char what[400];
		snprintf(what, sizeof(what), "%s%s%s%s%s%s%s", nm ? "misses global ranks [" : "", nm ? miss : "",
			 nm ? "]" : "", nm && ne ? " and " : "", ne ? "holds contributions of non-members [" : "",
			 ne ? extra : "", ne ? "]" : "");
		dptp_group_format(sp->used, used, sizeof(used));
		dptp_result_set(res, sp->rc == -ENOTSUP ? DPTP_ERROR : DPTP_FAIL, "%s all-reduce over %s: the sum %s "
				"(it ran over %s)", kind, gs, what, used);
	}
}

static void reduce_span_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	check_span(c, &s->tp, res);
	check_span(c, &s->dp, res);
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "TP all-reduce summed exactly %d members, DP all-reduce exactly %d",
				c->tp.size, c->dp.size);
}

static void reduce_span_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	if (s->buf)
		c->comm->ops->free(c->comm, s->buf);
	free(s->tp.got);
	free(s->dp.got);
	dptp_group_release(&s->sub);
}

const struct dptp_check dptp_check_reduce_span = {
	.name = "reduce-span",
	.summary = "all-reduces over the TP and the DP group sum exactly their members' contributions",
	.mech = "G",
	.state_size = sizeof(struct state),
	.prepare = reduce_span_prepare,
	.run = reduce_span_run,
	.verify = reduce_span_verify,
	.release = reduce_span_release,
};
