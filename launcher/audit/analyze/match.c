/* dptp-run --audit: the matching shared by the mechanisms (model.h): groups,
 * the per-group sequences of calls, the layout, findings and gaps. */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/audit_rec.h"

const char *const root_key[R_N] = {"src", "dst", "gsrc", "gdst"};

int grow(void **p, size_t *cap, size_t want, size_t sz)
{
	if (want <= *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 16;
	while (nc < want)
		nc *= 2;
	void *q = realloc(*p, nc * sz);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = nc;
	return 0;
}

/* A zeroed new last element of a growing array, or NULL. */
void *push(void *pv, size_t *n, size_t *cap, size_t sz)
{
	void **p = pv;
	if (grow(p, cap, *n + 1, sz) < 0)
		return NULL;
	char *e = (char *)*p + *n * sz;
	memset(e, 0, sz);
	(*n)++;
	return e;
}

bool is_p2p(const char *op)
{
	static const char *const p2p[] = {"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list"};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(p2p); i++)
		if (!strcmp(op, p2p[i]))
			return true;
	return false;
}

/* the input's size must agree on every member */
bool sized(const char *op)
{
	static const char *const v[] = {"broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
		"_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "gather", "scatter",
		"broadcast_object_list", "all_reduce_coalesced", "all_gather_coalesced"};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(v); i++)
		if (!strcmp(op, v[i]))
			return true;
	return false;
}

bool in_list(const int *v, size_t n, int64_t x)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

static size_t hash_group(int world, const int64_t *r, size_t n, int gn)
{
	size_t h = 1469598103934665603ull ^ (size_t)world ^ ((size_t)gn << 20);
	for (size_t i = 0; i < n; i++)
		h = (h ^ (size_t)r[i]) * 1099511628211ull;
	return h;
}

static bool group_is(const struct a_group *g, int world, const int64_t *r, size_t n, int gn)
{
	if (g->world != world || g->n != n || g->gn != gn)
		return false;
	for (size_t k = 0; k < n; k++)
		if (g->ranks[k] != r[k])
			return false;
	return true;
}

/* The index of the group (world, ranks, gn), made on first sight; -ENOMEM. */
int group_intern(struct job *j, int world, const int64_t *r, size_t n, int gn)
{
	if (j->ng * 2 >= j->ngslot) {
		size_t ns = j->ngslot ? j->ngslot * 2 : 256;
		size_t *slot = calloc(ns, sizeof(*slot));
		if (!slot)
			return -ENOMEM;
		for (size_t i = 0; i < j->ng; i++) {
			int64_t tmp[DPTP_MAX_WORLD];
			const struct a_group *g = &j->g[i];
			for (size_t k = 0; k < g->n; k++)
				tmp[k] = g->ranks[k];
			size_t h = hash_group(g->world, tmp, g->n, g->gn) & (ns - 1);
			while (slot[h])
				h = (h + 1) & (ns - 1);
			slot[h] = i + 1;
		}
		free(j->gslot);
		j->gslot = slot;
		j->ngslot = ns;
	}
	if (n > DPTP_MAX_WORLD)
		n = DPTP_MAX_WORLD;
	size_t h = hash_group(world, r, n, gn) & (j->ngslot - 1);
	while (j->gslot[h]) {
		if (group_is(&j->g[j->gslot[h] - 1], world, r, n, gn)) {
			struct a_group *g = &j->g[j->gslot[h] - 1];
			if (j->cur_lk < g->lk) /* the files are merged by time: the first in their order */
				g->lk = j->cur_lk;
			return (int)j->gslot[h] - 1;
		}
		h = (h + 1) & (j->ngslot - 1);
	}
	struct a_group *g = push(&j->g, &j->ng, &j->capg, sizeof(*j->g));
	if (!g || !(g->ranks = malloc((n ? n : 1) * sizeof(int))))
		return -ENOMEM;
	g->lk = j->cur_lk;
	for (size_t k = 0; k < n; k++)
		g->ranks[k] = (int)r[k];
	g->n = n;
	g->gn = gn;
	g->world = world;
	j->gslot[h] = j->ng;
	return (int)j->ng - 1;
}

bool world_group(const struct st *s, size_t gid)
{
	return s->j->g[gid].world == s->world;
}

/* ---- the layout ---------------------------------------------------- */

/* Does the sorted set of n ranks equal one group of the layout? */
static bool matches_layout(const struct dptp_layout *l, const int *sorted, size_t n, int *tmp)
{
	static const enum dptp_group_kind kinds[] = {DPTP_GROUP_TP, DPTP_GROUP_PP, DPTP_GROUP_DP, DPTP_GROUP_EP};
	for (size_t k = 0; k < DPTP_ARRAY_LEN(kinds); k++) {
		int m = dptp_layout_group(l, kinds[k], sorted[0], tmp, NULL);
		if ((size_t)m != n)
			continue;
		qsort(tmp, (size_t)m, sizeof(int), cmp_int);
		if (!memcmp(tmp, sorted, n * sizeof(int)))
			return true;
	}
	return false;
}

static void infer(struct st *s, struct audit_result *res)
{
	int w = s->size, *tmp = malloc(((size_t)w + 1) * sizeof(int)), *sorted = malloc(((size_t)w + 1) * sizeof(int));
	size_t nsub = 0;
	bool found = false;
	struct dptp_layout best = {0};
	const struct job *j = s->j;
	if (!tmp || !sorted)
		goto out;
	for (size_t i = 0; i < j->ng; i++)
		if (world_group(s, i) && j->g[i].n > 1 && (int)j->g[i].n < w)
			nsub++;
	if (!nsub) {
		dptp_layout_init(&res->layout, w, w, 1, 1, NULL);
		res->layout_known = true;
		snprintf(res->layout_how, sizeof(res->layout_how),
			"inferred: no group smaller than the world, every rank its own DP replica");
		goto out;
	}
	/* every factorisation whose TP, PP, DP or EP groups explain each
	 * subgroup the program made; the fewest pipeline stages win */
	for (int pp = 1; pp <= w && !found; pp++)
		for (int tp = 1; tp <= w; tp++) {
			struct dptp_layout l;
			if (w % (pp * tp) || dptp_layout_init(&l, w, w / (pp * tp), pp, tp, NULL) < 0 || (tp == 1 && pp == 1))
				continue;
			bool ok = true;
			for (size_t i = 0; i < j->ng && ok; i++) {
				const struct a_group *g = &j->g[i];
				bool bad = false;
				if (!world_group(s, i) || g->n <= 1 || (int)g->n >= w)
					continue;
				for (size_t k = 0; k < g->n; k++)
					bad |= g->ranks[k] < 0 || g->ranks[k] >= w;
				if (bad) {
					ok = false;
					break;
				}
				memcpy(sorted, g->ranks, g->n * sizeof(int));
				qsort(sorted, g->n, sizeof(int), cmp_int);
				ok = matches_layout(&l, sorted, g->n, tmp);
			}
			if (ok) {
				best = l;
				found = true;
				break;
			}
		}
	if (found) {
		res->layout = best;
		res->layout_known = true;
		snprintf(res->layout_how, sizeof(res->layout_how), "inferred from the %zu subgroup%s the program made", nsub,
			nsub == 1 ? "" : "s");
	} else {
		snprintf(res->layout_how, sizeof(res->layout_how),
			"could not be inferred: the program's subgroups are not the TP, PP, DP or EP groups of any DPxPPxTP of world %d; give --audit-layout",
			w);
	}
out:
	free(tmp);
	free(sorted);
}

void infer_layout(struct st *s, const struct dptp_layout *given)
{
	struct audit_result *res = s->out;
	if (!given) {
		infer(s, res);
	} else if (given->world != s->size) {
		snprintf(res->layout_how, sizeof(res->layout_how),
			"--audit-layout %dx%dx%d is %d ranks; the world has %d: findings not per replica", given->dp, given->pp,
			given->tp, given->world, s->size);
	} else {
		res->layout = *given;
		res->layout_known = true;
		snprintf(res->layout_how, sizeof(res->layout_how), "given (--audit-layout)");
	}
}

/* ---- findings ------------------------------------------------------ */

int replica_of(const struct audit_result *res, int rank)
{
	if (!res->layout_known || rank < 0 || rank >= res->layout.world)
		return -1;
	return dptp_layout_coord(&res->layout, rank).dp;
}

bool group_spans_replicas(const struct st *s, const struct a_group *g)
{
	for (size_t m = 1; m < g->n; m++)
		if (replica_of(s->out, g->ranks[m]) != replica_of(s->out, g->ranks[0]))
			return true;
	return false;
}

void fmt_ranks(char *buf, size_t len, const int *v, size_t n)
{
	size_t off = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "," : "", v[i]);
}

int add_finding(struct st *s, char mech, const int *ranks, size_t nranks, const char *site, const char *op,
		const char *fmt, ...)
{
	struct audit_result *res = s->out;
	/* released with the result whatever happens next */
	struct audit_finding *f = push(&res->f, &res->nf, &s->capf, sizeof(*res->f));
	if (!f)
		return -ENOMEM;
	f->mech = mech;
	f->attempt = res->attempt;
	snprintf(f->world_id, sizeof(f->world_id), "%s", res->world_id);
	f->ranks = malloc((nranks ? nranks : 1) * sizeof(int));
	f->replicas = malloc((nranks ? nranks : 1) * sizeof(int));
	f->site = strdup(site ? site : "");
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&f->detail, fmt, ap) < 0)
		f->detail = NULL;
	va_end(ap);
	if (!f->ranks || !f->replicas || !f->site || !f->detail)
		return -ENOMEM;
	for (size_t i = 0; i < nranks; i++)
		if (!in_list(f->ranks, f->nranks, ranks[i]))
			f->ranks[f->nranks++] = ranks[i];
	qsort(f->ranks, f->nranks, sizeof(int), cmp_int);
	for (size_t i = 0; i < f->nranks; i++) {
		int d = replica_of(res, f->ranks[i]);
		if (d >= 0 && !in_list(f->replicas, f->nreplicas, d))
			f->replicas[f->nreplicas++] = d;
	}
	qsort(f->replicas, f->nreplicas, sizeof(int), cmp_int);
	snprintf(f->op, sizeof(f->op), "%s", op ? op : "");
	return 0;
}

int set_group(struct audit_finding *f, const int *ranks, size_t n)
{
	free(f->group);
	f->group = malloc((n ? n : 1) * sizeof(int));
	if (!f->group)
		return -ENOMEM;
	if (n)
		memcpy(f->group, ranks, n * sizeof(int));
	f->ngroup = n;
	return 0;
}

int add_gap(struct st *s, int rank, pid_t pid, const char *fmt, ...)
{
	struct audit_result *res = s->out;
	struct audit_gap *g = push(&res->gaps, &res->ngaps, &s->capgaps, sizeof(*res->gaps));
	if (!g)
		return -ENOMEM;
	g->rank = rank;
	g->pid = pid;
	g->attempt = res->attempt;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g->why, sizeof(g->why), fmt, ap);
	va_end(ap);
	return 0;
}

void called_from(char *buf, size_t len, const char *site, const char *outer)
{
	if (outer && outer[0] && strcmp(outer, site ? site : ""))
		snprintf(buf, len, " (called from %s)", outer);
	else if (len)
		buf[0] = '\0';
}

void describe_op(char *buf, size_t len, const struct a_op *o)
{
	size_t off = (size_t)snprintf(buf, len, "%s(", o->op);
	const char *sep = "";
	if (o->n >= 0 && off < len) {
		off += (size_t)snprintf(buf + off, len - off, "n=%lld", (long long)o->n);
		sep = ", ";
	}
	if (o->dt[0] && off < len) {
		off += (size_t)snprintf(buf + off, len - off, "%s%s", sep, o->dt);
		sep = ", ";
	}
	for (int k = 0; k < R_N && off < len; k++)
		if (o->has[k]) {
			off += (size_t)snprintf(buf + off, len - off, "%s%s=%lld", sep, root_key[k], (long long)o->root[k]);
			sep = ", ";
		}
	if (off < len)
		snprintf(buf + off, len - off, ")");
}

bool same_call(const struct a_op *a, const struct a_op *b)
{
	if (strcmp(a->op, b->op))
		return false;
	if (sized(a->op) && a->n >= 0 && b->n >= 0 && a->n != b->n)
		return false;
	if (a->dt[0] && b->dt[0] && strcmp(a->dt, b->dt))
		return false;
	for (int k = 0; k < R_N; k++)
		if (a->has[k] && b->has[k] && a->root[k] != b->root[k])
			return false;
	return true;
}

uint64_t sig_hash(const char *sig)
{
	return dptp_audit_sig_hash(sig, strlen(sig));
}

uint64_t op_term(const char *op, int64_t n, const char *dt, const bool *has, const int64_t *root, long long pos)
{
	char sig[256];
	size_t off = (size_t)snprintf(sig, sizeof(sig), "%s|%lld|%s|", op, (long long)n, dt);
	const char *sep = "";
	for (int k = 0; k < R_N && off < sizeof(sig); k++)
		if (has[k]) {
			off += (size_t)snprintf(sig + off, sizeof(sig) - off, "%s%s=%lld", sep, root_key[k], (long long)root[k]);
			sep = ",";
		}
	return dptp_audit_term(sig_hash(sig), (uint64_t)pos);
}

/* the sequences of one group: its window (calls.c) */
int build_seqs(const struct st *s, int gid, struct seqs *q)
{
	const struct a_group *g = &s->j->g[gid];
	const struct a_win *w = (size_t)gid < s->j->nwin && s->j->win[gid].m ? &s->j->win[gid] : NULL;
	q->n = g->n;
	q->w = w;
	q->base = w ? w->base : 0;
	q->in = calloc(g->n ? g->n : 1, sizeof(*q->in));
	q->len = calloc(g->n ? g->n : 1, sizeof(*q->len));
	if (!q->in || !q->len)
		return -ENOMEM;
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		if (r < 0 || r >= s->size || !(s->r[r].py || s->r[r].nccl))
			continue;
		q->in[m] = true;
		q->len[m] = w ? w->m[m].len : 0;
	}
	return 0;
}

const struct a_op *seq_at(const struct seqs *q, size_t m, size_t k)
{
	return m < q->n && q->in[m] ? win_at(q->w, m, k) : NULL;
}

const struct a_op *seq_last(const struct seqs *q, size_t m)
{
	return m < q->n && q->in[m] && q->len[m] ? &q->w->m[m].last : NULL;
}

void free_seqs(struct seqs *q)
{
	free(q->in);
	free(q->len);
}
