/* broadcast: the exchange backend's broadcast, from every group-local root
 * of every group of two or more ranks inside one DP replica (TP groups, PP
 * groups when pp > 1), delivers that root's payload on the control plane
 * (objects) and on the data plane (buffers). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"

struct stamp {
	int32_t global_rank;
	int32_t kind;
	int32_t root;
	int32_t pad;
	uint64_t nonce;
};

#define DATA_WORDS 256

/* One broadcast round: what was sent from where, and what arrived. */
struct round {
	const struct dptp_group *g;
	int root, want;
	int orc, brc;                  /* object and buffer broadcast */
	int crc;                       /* the copies to and from the data plane */
	struct dptp_err oerr, berr;
	struct stamp got;
	uint32_t words[DATA_WORDS];
};

struct state {
	void *data;                    /* data-plane buffer */
	int n;
	struct round *rounds;
};

static uint64_t nonce_of(const struct dptp_ctx *c, int kind, int root, int global)
{
	return dptp_mix64(c->p.seed ^ ((uint64_t)kind << 48) ^ ((uint64_t)root << 32) ^ (uint64_t)global);
}

static uint32_t word_of(const struct dptp_ctx *c, const struct round *o, int i)
{
	return (uint32_t)dptp_mix64(nonce_of(c, o->g->kind, o->root, o->want) + (uint64_t)i);
}

static const char *broadcast_skip(const struct dptp_ctx *c)
{
	return c->layout.tp > 1 || c->layout.pp > 1 ? NULL
		: "no group of two or more ranks inside a DP replica (tp = pp = 1)";
}

/* The rounds: every group-local root of the TP group, then of the PP group
 * (groups of one kind have one size, so the count is the same everywhere). */
static int broadcast_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	const struct dptp_group *gs[2] = { c->layout.tp > 1 ? &c->tp : NULL, c->layout.pp > 1 ? &c->pp : NULL };
	s->rounds = calloc((size_t)(c->layout.tp + c->layout.pp), sizeof(*s->rounds));
	s->data = c->comm->ops->alloc(c->comm, DATA_WORDS * sizeof(uint32_t));
	if (!s->rounds || !s->data)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (int k = 0; k < 2; k++)
		for (int root = 0; gs[k] && root < gs[k]->size; root++) {
			struct round *o = &s->rounds[s->n++];
			o->g = gs[k];
			o->root = root;
			o->want = gs[k]->ranks[root];
		}
	return 0;
}

static void broadcast_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	for (int k = 0; k < s->n; k++) {
		struct round *o = &s->rounds[k];
		/* control plane: an object stamped with the root's identity */
		if (c->rank == o->want)
			o->got = (struct stamp){ .global_rank = c->rank, .kind = o->g->kind, .root = o->root,
						 .nonce = nonce_of(c, o->g->kind, o->root, c->rank) };
		o->orc = dptp_xchg_bcast_root(&c->x, o->g, o->root, &o->got, sizeof(o->got), &o->oerr);
		/* data plane: a buffer whose every word names the root */
		for (int i = 0; i < DATA_WORDS; i++)
			o->words[i] = c->rank == o->want ? word_of(c, o, i) : 0xdeadbeefu;
		/* the broadcast is collective: made whatever the upload said */
		o->crc = c->comm->ops->upload(c->comm, s->data, o->words, sizeof(o->words));
		o->brc = dptp_xchg_bcast_buf(&c->x, c->comm, o->g, o->root, s->data, sizeof(o->words),
					     &o->berr);
		if (o->brc == 0 && o->crc == 0)
			o->crc = c->comm->ops->download(c->comm, o->words, s->data, sizeof(o->words));
	}
	/* a root whose upload failed sent garbage to its group: every rank
	 * learns of a failed copy, and none calls what it got a finding */
	int crc = 0;
	for (int k = 0; k < s->n && crc == 0; k++)
		crc = s->rounds[k].crc;
	dptp_check_share_outcome(c, crc, NULL, "copying a broadcast buffer to or from the device", "no verdict",
				 "copy a broadcast buffer to or from its device", res);
}

static void broadcast_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	for (int k = 0; k < s->n; k++) {
		const struct round *o = &s->rounds[k];
		const char *kind = dptp_group_kind_name(o->g->kind);
		char gs[256], what[300];
		dptp_group_format(o->g, gs, sizeof(gs));
		if (o->orc < 0) {
			snprintf(what, sizeof(what), "object broadcast in %s group %s from group rank %d",
				 kind, gs, o->root);
			dptp_result_fail(res, DPTP_FAIL, o->orc, &o->oerr, what);
		} else if ((o->got.global_rank != o->want || o->got.root != o->root ||
			    o->got.nonce != nonce_of(c, o->g->kind, o->root, o->want)) && res->status < DPTP_FAIL) {
			dptp_result_set(res, DPTP_FAIL,
				"object broadcast in %s group %s from group rank %d (global rank %d) "
				"delivered the payload of global rank %d",
				kind, gs, o->root, o->want, o->got.global_rank);
		}
		if (o->brc < 0) {
			snprintf(what, sizeof(what), "buffer broadcast in %s group %s from group rank %d",
				 kind, gs, o->root);
			dptp_result_fail(res, DPTP_FAIL, o->brc, &o->berr, what);
			continue;
		}
		if (o->crc < 0)
			continue; /* no broadcast in the buffer: run made the result `error` */
		for (int i = 0; i < DATA_WORDS; i++)
			if (o->words[i] != word_of(c, o, i)) {
				if (res->status < DPTP_FAIL)
					dptp_result_set(res, DPTP_FAIL,
						"buffer broadcast in %s group %s from group rank %d (global rank %d): "
						"word %d is 0x%08x, not the root's",
						kind, gs, o->root, o->want, i, o->words[i]);
				break;
			}
	}
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "%d broadcasts from every root of the %s%s groups", s->n,
				c->layout.tp > 1 ? "TP" : "", c->layout.pp > 1 ? (c->layout.tp > 1 ? " and PP" : "PP") : "");
}

static void broadcast_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	if (s->data)
		c->comm->ops->free(c->comm, s->data);
	free(s->rounds);
}

const struct dptp_check dptp_check_broadcast = {
	.name = "broadcast",
	.summary = "group broadcasts from every group-local root deliver that root's payload (objects and buffers)",
	.mech = "R",
	.skip = broadcast_skip,
	.state_size = sizeof(struct state),
	.prepare = broadcast_prepare,
	.run = broadcast_run,
	.verify = broadcast_verify,
	.release = broadcast_release,
};
