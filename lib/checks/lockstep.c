/* lockstep (mechanism P of reference/FAMILY.md): a few steps of a DP
 * serving loop, in which every member of every group must enter the same
 * collectives (operation, group, bytes) in the same order.
 *
 * Each step of replica d (tokens + d + step tokens; the last replica is idle,
 * zero tokens, at one step) makes three collectives, as a DP+TP engine's
 * forward does:
 *   #3s   all-reduce over the DP group of the token counts (the DP-wide
 *         synchronisation an idle replica must still join);
 *   #3s+1 all-gather over the DP group of the dispatched token ids, sized
 *         from the DP-synced maximum (an idle replica sends a dummy batch);
 *   #3s+2 all-reduce over the TP group of the activations, same size.
 * The collectives move their bytes over the bootstrap's published keys (no
 * world fence), each with a short deadline: a member that never enters one
 * is found after that deadline, not after --timeout, and the job stays in
 * lockstep. Every rank records what it entered; the records are then
 * gathered over the world and compared, which tells the rank that skipped a
 * collective (the cause) from the ranks that waited for it (the victims). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "report/gather.h"

#define STEPS 3
#define IDLE_STEP 1
#define PER_STEP 3
#define NCOLL (STEPS * PER_STEP)
/* how long a member waits for its peers at one collective: this, or
 * SLOW_FACTOR times what the world's exchange just before the run took
 * (valgrind, an overloaded machine), at most a third of the time left */
#define COLL_DEADLINE 2.0
#define SLOW_FACTOR 50.0

enum op { OP_NONE, OP_ALLREDUCE, OP_ALLGATHER };

/* What a rank records of one collective it entered, and the header of the
 * bytes it publishes for it. */
struct entry {
	int32_t entered;  /* 0: never entered */
	int32_t op;       /* enum op */
	int32_t kind;     /* enum dptp_group_kind */
	int32_t first;    /* the group's first member: which group of that kind */
	int32_t bytes;    /* payload bytes */
	int32_t step;
};

struct state {
	char prefix[64];         /* of this run's keys */
	struct entry mine[NCOLL];
	struct entry *all;       /* [world][NCOLL], gathered after the loop */
	int32_t *buf;            /* payload scratch: [group size][max elements] */
	size_t cap;              /* elements per member in buf */
	char problem[512];       /* the first thing this rank saw go wrong */
	int problem_k;           /* its collective, -1 none */
	double prepared;         /* when prepare ended (the driver's exchange follows) */
	double wait;             /* the per-collective deadline, seconds */
	int wrong_data;          /* results that differ from the reference */
	char wrong[256];
};

static const char *slot_name(int j)
{
	static const char *const names[PER_STEP] = {
		"all-reduce of the token counts", "all-gather of the dispatched tokens",
		"all-reduce of the activations",
	};
	return names[j];
}

static const struct dptp_group *group_of(const struct dptp_ctx *c, enum dptp_group_kind kind)
{
	return kind == DPTP_GROUP_TP ? &c->tp : &c->dp;
}

/* Tokens replica d holds at step s: uneven, and the last replica idle once. */
static int tokens_at(const struct dptp_ctx *c, int d, int s)
{
	if (d == c->layout.dp - 1 && s == IDLE_STEP)
		return 0;
	return c->p.tokens + d + s;
}

/* Token t of replica d at step s: an id below 2^16, so sums stay exact. */
static int32_t token_id(const struct dptp_ctx *c, int d, int s, int t)
{
	uint64_t h = dptp_mix64(c->p.seed ^ 0x10c57e9ULL ^ ((uint64_t)d << 40) ^ ((uint64_t)s << 24) ^ (uint64_t)t);
	return (int32_t)(h & 0xffff);
}

static const char *skip_of(const struct dptp_ctx *c)
{
	if (c->layout.dp == 1 && c->layout.tp == 1)
		return "no TP or DP group of two or more ranks";
	return NULL;
}

static int lockstep_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	int maxg = c->dp.size > c->tp.size ? c->dp.size : c->tp.size;
	s->cap = (size_t)c->p.tokens + (size_t)c->layout.dp + STEPS + 1;
	s->buf = calloc((size_t)maxg * s->cap, sizeof(int32_t));
	s->all = calloc((size_t)c->layout.world, sizeof(s->mine));
	s->problem_k = -1;
	s->prepared = dptp_now();
	if (!s->buf || !s->all)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	return 0;
}

static void describe(char *out, size_t n, const struct dptp_ctx *c, int k, enum dptp_group_kind kind)
{
	char g[128];
	dptp_group_format(group_of(c, kind), g, sizeof(g));
	snprintf(out, n, "collective #%d on %s group %s (%s, step %d)", k, kind == DPTP_GROUP_TP ? "TP" : "DP", g,
		 slot_name(k % PER_STEP), k / PER_STEP);
}

/* One collective over group `kind`: publish my entry and n elements, then
 * take every member's, each within s->wait. out: [size][n] in group
 * order. Returns 0, or -1 with s->problem set. */
static int enter(struct dptp_ctx *c, struct state *s, int k, enum op op, enum dptp_group_kind kind,
		 const int32_t *mine, size_t n, int32_t *out)
{
	const struct dptp_group *g = group_of(c, kind);
	struct entry e = { .entered = 1, .op = op, .kind = kind, .first = g->ranks[0],
			   .bytes = (int32_t)(n * sizeof(int32_t)), .step = k / PER_STEP };
	s->mine[k] = e;
	size_t len = sizeof(e) + n * sizeof(int32_t);
	char *blob = malloc(len), key[96], what[256];
	struct dptp_err err = {0};
	if (!blob) {
		snprintf(s->problem, sizeof(s->problem), "out of memory at collective #%d", k);
		s->problem_k = k;
		return -1;
	}
	memcpy(blob, &e, sizeof(e));
	memcpy(blob + sizeof(e), mine, n * sizeof(int32_t));
	snprintf(key, sizeof(key), "%s.%d", s->prefix, k);
	int rc = dptp_bootstrap_publish(c->b, key, blob, len, &err);
	free(blob);
	describe(what, sizeof(what), c, k, kind);
	if (rc < 0) {
		snprintf(s->problem, sizeof(s->problem), "%s: publishing: %s", what, err.msg);
		s->problem_k = k;
		return -1;
	}
	double deadline = dptp_now() + s->wait;
	if (deadline > c->x.deadline)
		deadline = c->x.deadline;
	for (int i = 0; i < g->size; i++) {
		int q = g->ranks[i];
		if (q == c->rank) {
			memcpy(out + (size_t)i * n, mine, n * sizeof(int32_t));
			continue;
		}
		void *data = NULL;
		size_t dl = 0;
		rc = dptp_fetch_published(c->b, q, key, deadline, &data, &dl, &err);
		struct entry pe = {0};
		if (rc == 0 && dl >= sizeof(pe))
			memcpy(&pe, data, sizeof(pe));
		if (rc < 0) {
			snprintf(s->problem, sizeof(s->problem), "rank %d never entered %s: waited %.1f s",
				 q, what, s->wait);
		} else if (dl < sizeof(pe) || pe.op != e.op || pe.kind != e.kind || pe.first != e.first) {
			snprintf(s->problem, sizeof(s->problem), "rank %d entered another collective as #%d than %s",
				 q, k, what);
		} else if (pe.bytes != e.bytes || dl != len) {
			snprintf(s->problem, sizeof(s->problem),
				 "members disagree on the size of %s: rank %d entered it with %d bytes, rank %d with %d bytes",
				 what, c->rank, e.bytes, q, pe.bytes);
		} else {
			memcpy(out + (size_t)i * n, (char *)data + sizeof(pe), n * sizeof(int32_t));
			free(data);
			continue;
		}
		free(data);
		s->problem_k = k;
		return -1;
	}
	return 0;
}

/* The size of the DP-wide collective: the DP-synced maximum of the token
 * counts (local-shape: this replica's own unpadded count). */
static size_t dispatch_count(const struct dptp_ctx *c, const int32_t *synced, int own)
{
	if (dptp_fault_on(c->p.faults, DPTP_FAULT_LOCAL_SHAPE))
		return (size_t)own;
	int32_t m = 0;
	for (int d = 0; d < c->layout.dp; d++)
		if (synced[d] > m)
			m = synced[d];
	return (size_t)m;
}

static void wrong_data(struct state *s, int k, const char *what, int who, int value)
{
	if (s->wrong_data++)
		return;
	snprintf(s->wrong, sizeof(s->wrong), "collective #%d: %s %d: %d", k, what, who, value);
}

/* One step of the serving loop on this rank. Returns 0, or -1 once a
 * collective went wrong (the loop stops there, as an engine would hang). */
static int serve_step(struct dptp_ctx *c, struct state *s, int step)
{
	int dp = c->layout.dp, myd = c->me.dp;
	int ntok = tokens_at(c, myd, step);
	int k = step * PER_STEP;
	/* idle-skip: a replica with nothing to do returns before the DP-wide
	 * collectives its peers enter */
	if (ntok == 0 && dptp_fault_on(c->p.faults, DPTP_FAULT_IDLE_SKIP))
		return 0;

	/* #3s: token counts, one slot per DP index, summed over DP */
	int32_t *counts = calloc((size_t)dp * (size_t)c->dp.size + (size_t)dp, sizeof(int32_t));
	if (!counts) {
		snprintf(s->problem, sizeof(s->problem), "out of memory at step %d", step);
		s->problem_k = k;
		return -1;
	}
	int32_t *mine = counts + (size_t)dp * (size_t)c->dp.size;
	mine[myd] = ntok;
	int rc = enter(c, s, k, OP_ALLREDUCE, DPTP_GROUP_DP, mine, (size_t)dp, counts);
	for (int d = 0; rc == 0 && d < dp; d++) {
		int32_t sum = 0;
		for (int i = 0; i < c->dp.size; i++)
			sum += counts[(size_t)i * (size_t)dp + (size_t)d];
		mine[d] = sum;
		if (sum != tokens_at(c, d, step))
			wrong_data(s, k, "token count of replica", d, sum);
	}
	size_t n = rc == 0 ? dispatch_count(c, mine, ntok) : 0;
	free(counts);
	if (rc < 0)
		return -1;
	if (n > s->cap)
		n = s->cap;

	/* #3s+1: the dispatched token ids, padded with -1 (a dummy batch when idle) */
	int32_t *send = malloc((n ? n : 1) * sizeof(int32_t));
	if (!send) {
		snprintf(s->problem, sizeof(s->problem), "out of memory at step %d", step);
		s->problem_k = k + 1;
		return -1;
	}
	for (size_t t = 0; t < n; t++)
		send[t] = (int)t < ntok ? token_id(c, myd, step, (int)t) : -1;
	rc = enter(c, s, k + 1, OP_ALLGATHER, DPTP_GROUP_DP, send, n, s->buf);
	for (int i = 0; rc == 0 && i < c->dp.size; i++) {
		int d = dptp_layout_coord(&c->layout, c->dp.ranks[i]).dp;
		for (size_t t = 0; t < n; t++) {
			int32_t want = (int)t < tokens_at(c, d, step) ? token_id(c, d, step, (int)t) : -1;
			if (s->buf[(size_t)i * n + t] != want) {
				wrong_data(s, k + 1, "wrong token id from replica", d, (int)t);
				break;
			}
		}
	}

	/* #3s+2: activations of the padded batch, reduced over TP */
	int ti = c->tp.index;
	for (size_t t = 0; rc == 0 && t < n; t++)
		send[t] = (int)t < ntok ? token_id(c, myd, step, (int)t) * (ti + 1) : 0;
	if (rc == 0)
		rc = enter(c, s, k + 2, OP_ALLREDUCE, DPTP_GROUP_TP, send, n, s->buf);
	int tp = c->tp.size;
	for (size_t t = 0; rc == 0 && t < n; t++) {
		/* modulo 2^32 on both sides: id * tp(tp+1)/2 passes INT32_MAX from tp 256 */
		uint32_t sum = 0, want = (int)t < ntok ? (uint32_t)token_id(c, myd, step, (int)t) *
							(uint32_t)((int64_t)tp * (tp + 1) / 2) : 0;
		for (int i = 0; i < tp; i++)
			sum += (uint32_t)s->buf[(size_t)i * n + t];
		if (sum != want) {
			wrong_data(s, k + 2, "activation sum of token", (int)t, (int)sum);
			break;
		}
	}
	free(send);
	return rc;
}

static void lockstep_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	/* keys unique in the job: the layout and the exchange's sequence,
	 * the same on every rank here */
	snprintf(s->prefix, sizeof(s->prefix), "dptp.ls.%dx%dx%d.%llu", c->layout.dp, c->layout.pp,
		 c->layout.tp, (unsigned long long)c->x.seq);
	/* the world's exchange between prepare and run says how slow this
	 * machine is now; the same choice need not be made on every rank */
	s->wait = SLOW_FACTOR * (dptp_now() - s->prepared);
	if (s->wait < COLL_DEADLINE)
		s->wait = COLL_DEADLINE;
	/* and leaves most of the check's deadline to the comparison of the
	 * records that follows (a victim waits once, the cause once more) */
	double left = (c->x.deadline - dptp_now()) / 3;
	if (s->wait > left)
		s->wait = left > 0.1 ? left : 0.1;
	for (int step = 0; step < STEPS; step++)
		if (serve_step(c, s, step) < 0)
			break;
	/* compare the records: every rank takes part, whatever happened */
	struct dptp_err err = {0};
	int rc = dptp_xchg_allgather(&c->x, &c->world, s->mine, sizeof(s->mine), s->all, &err);
	if (rc < 0)
		dptp_result_fail(res, DPTP_ERROR, rc, &err, "gathering the records of collectives");
}

static const struct entry *rec(const struct state *s, int rank, int k)
{
	return &s->all[(size_t)rank * NCOLL + (size_t)k];
}

/* The last collective `rank` entered, -1 if none. */
static int last_entered(const struct state *s, int rank)
{
	int last = -1;
	for (int k = 0; k < NCOLL; k++)
		if (rec(s, rank, k)->entered)
			last = k;
	return last;
}

/* Collectives this rank skipped that members of its group entered: the
 * cause, told apart from the victims by the records. */
static void find_skips(const struct dptp_ctx *c, const struct state *s, char *out, size_t n)
{
	size_t off = 0;
	out[0] = 0;
	/* past the collective this rank got stuck at, it entered nothing:
	 * stopped, not skipped */
	int end = s->problem_k >= 0 ? s->problem_k : NCOLL;
	for (int k = 0; k < end && off < n; k++) {
		if (s->mine[k].entered)
			continue;
		for (int kind = DPTP_GROUP_TP; kind <= DPTP_GROUP_DP; kind += DPTP_GROUP_DP - DPTP_GROUP_TP) {
			const struct dptp_group *g = group_of(c, (enum dptp_group_kind)kind);
			char who[128] = "";
			size_t w = 0;
			for (int i = 0; i < g->size; i++) {
				const struct entry *e = rec(s, g->ranks[i], k);
				if (g->ranks[i] != c->rank && e->entered && e->kind == kind && e->first == g->ranks[0])
					w += (size_t)snprintf(who + w, w < sizeof(who) ? sizeof(who) - w : 0, "%s%d",
							      w ? ", " : "", g->ranks[i]);
			}
			if (!w)
				continue;
			char what[256];
			describe(what, sizeof(what), c, k, (enum dptp_group_kind)kind);
			off += (size_t)snprintf(out + off, n - off,
				"%sskipped %s that rank %s entered (this replica held %d tokens at step %d)",
				off ? "; " : "", what, who, tokens_at(c, c->me.dp, k / PER_STEP), k / PER_STEP);
			break;
		}
		if (off)
			break; /* the first one is the cause; later ones follow from it */
	}
}

static void lockstep_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	if (res->status >= DPTP_FAIL)
		return;
	char skipped[512];
	find_skips(c, s, skipped, sizeof(skipped));
	if (*skipped) {
		dptp_result_set(res, DPTP_FAIL, "%s%s%s", skipped, s->problem_k >= 0 ? "; then " : "", s->problem);
		return;
	}
	if (s->problem_k >= 0) {
		dptp_result_set(res, DPTP_FAIL, "%s", s->problem);
		/* what the records say of the rank it waited for */
		int q = -1;
		if (sscanf(s->problem, "rank %d never entered", &q) == 1 && q >= 0 && q < c->layout.world) {
			int last = last_entered(s, q);
			if (last > s->problem_k)
				dptp_result_append(res, " (its records: it skipped #%d and went on to #%d)", s->problem_k, last);
			else
				dptp_result_append(res, " (its records: it stopped after #%d)", last);
		}
		return;
	}
	if (s->wrong_data) {
		dptp_result_set(res, DPTP_FAIL, "%d wrong results; first at %s", s->wrong_data, s->wrong);
		return;
	}
	int entered = 0;
	for (int k = 0; k < NCOLL; k++)
		entered += s->mine[k].entered;
	dptp_result_set(res, DPTP_PASS, "%d steps, %d collectives entered by every member of TP %d and DP %d, "
			"replica %d idle at step %d and still in the DP-wide sync", STEPS, entered, c->tp.size,
			c->dp.size, c->layout.dp - 1, IDLE_STEP);
}

static void lockstep_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	free(s->buf);
	free(s->all);
}

const struct dptp_check dptp_check_lockstep = {
	.name = "lockstep",
	.mech = "P",
	.summary = "every member of every group enters the same collectives; an idle replica still syncs",
	.skip = skip_of,
	.state_size = sizeof(struct state),
	.prepare = lockstep_prepare,
	.run = lockstep_run,
	.verify = lockstep_verify,
	.release = lockstep_release,
};
