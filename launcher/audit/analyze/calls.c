/* dptp-run --audit: the collective and point-to-point calls, taken one at a
 * time as the load merges the files by time (model.h). Nothing here grows
 * with the number of calls: each group keeps a window of the positions not
 * yet matched on every member (bounded by the skew between its ranks; a
 * group whose members disagreed keeps the position where they did), each
 * process its last A_RING calls, and the mechanisms their summaries keyed by
 * what the program's code makes distinct (call sites, groups, ranks, roots):
 * counts per call site (the hang's counts), the steps from one call site to
 * the next (the hang's "novel step"), roots outside their group and the
 * peers of point-to-point calls (R), the broadcast rounds (G). */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- a map from a few words to a number -------------------------------- */

static size_t kmap_hash(const uintptr_t *k, unsigned words)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (unsigned i = 0; i < words; i++)
		h = (h ^ (uint64_t)k[i]) * 0x100000001b3ull ^ (h >> 29);
	return (size_t)h;
}

/* the value of key, NULL when absent (add: made, 0; NULL on ENOMEM) */
size_t *kmap_get(struct kmap *m, const uintptr_t *key, bool add)
{
	unsigned w = m->words;
	if (add && (m->n + 1) * 2 > m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 64;
		uintptr_t *k = calloc(nc * w, sizeof(*k));
		size_t *v = calloc(nc, sizeof(*v));
		bool *used = calloc(nc, sizeof(*used));
		if (!k || !v || !used) {
			free(k);
			free(v);
			free(used);
			return NULL;
		}
		for (size_t i = 0; i < m->cap; i++) {
			if (!m->used[i])
				continue;
			size_t h = kmap_hash(&m->k[i * w], w) & (nc - 1);
			while (used[h])
				h = (h + 1) & (nc - 1);
			used[h] = true;
			memcpy(&k[h * w], &m->k[i * w], w * sizeof(*k));
			v[h] = m->v[i];
		}
		free(m->k);
		free(m->v);
		free(m->used);
		m->k = k;
		m->v = v;
		m->used = used;
		m->cap = nc;
	}
	if (!m->cap)
		return NULL;
	size_t h = kmap_hash(key, w) & (m->cap - 1);
	while (m->used[h]) {
		if (!memcmp(&m->k[h * w], key, w * sizeof(*key)))
			return &m->v[h];
		h = (h + 1) & (m->cap - 1);
	}
	if (!add)
		return NULL;
	m->used[h] = true;
	memcpy(&m->k[h * w], key, w * sizeof(*key));
	m->v[h] = 0;
	m->n++;
	return &m->v[h];
}

static void kmap_release(struct kmap *m)
{
	free(m->k);
	free(m->v);
	free(m->used);
	m->k = NULL;
	m->v = NULL;
	m->used = NULL;
	m->n = m->cap = 0;
}

/* ---- a process's last calls ------------------------------------------- */

const struct a_op *proc_call(const struct a_proc *p, size_t back)
{
	if (!p->ring || back >= p->nring || back >= A_RING)
		return NULL;
	return &p->ring[(p->nring - 1 - back) % A_RING];
}

/* a `done`: its call among the process's last ones returned */
void calls_done(struct a_proc *p, int gid, long long seq, bool err)
{
	for (size_t b = 0; b < A_RING && b < p->nring; b++) {
		struct a_op *o = &p->ring[(p->nring - 1 - b) % A_RING];
		if (o->gid == gid && o->seq == seq) {
			o->done = true;
			o->err = err;
			return;
		}
	}
}

/* ---- a group's window -------------------------------------------------- */

static struct a_op *slot(const struct a_mwin *w, size_t pos)
{
	return &w->v[pos & (w->cap - 1)];
}

const struct a_op *win_at(const struct a_win *w, size_t m, size_t pos)
{
	if (!w || m >= w->n || pos < w->base || pos >= w->m[m].held)
		return NULL;
	const struct a_op *o = slot(&w->m[m], pos);
	return o->op ? o : NULL;
}

static int win_room(struct a_mwin *w, size_t base, size_t want)
{
	if (want - base <= w->cap)
		return 0;
	size_t nc = w->cap ? w->cap * 2 : 16;
	while (nc < want - base)
		nc *= 2;
	struct a_op *v = calloc(nc, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t p = base; p < w->held; p++)
		v[p & (nc - 1)] = *slot(w, p);
	free(w->v);
	w->v = v;
	w->cap = nc;
	return 0;
}

static int member_of(const struct a_group *g, int rank)
{
	for (size_t m = 0; m < g->n; m++)
		if (g->ranks[m] == rank)
			return (int)m;
	return -1;
}

/* the positions every member reached and on which they agree are dropped;
 * where they disagree the group keeps that position (frozen) */
static void win_advance(struct job *j, struct a_win *w)
{
	while (!w->frozen) {
		const struct a_op *first = NULL;
		for (size_t m = 0; m < w->n; m++)
			if (w->m[m].held <= w->base)
				return;
		for (size_t m = 0; m < w->n && !w->frozen; m++) {
			const struct a_op *o = win_at(w, m, w->base);
			if (o && !first)
				first = o;
			else if (o && !same_call(first, o))
				w->frozen = true;
		}
		if (w->frozen)
			return;
		for (size_t m = 0; m < w->n; m++)
			slot(&w->m[m], w->base)->op = NULL;
		w->base++;
		j->held -= w->n;
	}
}

static int win_add(struct job *j, const struct a_op *o)
{
	if (grow((void **)&j->win, &j->capwin, (size_t)o->gid + 1, sizeof(*j->win)) < 0)
		return -ENOMEM;
	if ((size_t)o->gid >= j->nwin) {
		memset(j->win + j->nwin, 0, ((size_t)o->gid + 1 - j->nwin) * sizeof(*j->win));
		j->nwin = (size_t)o->gid + 1;
	}
	struct a_win *w = &j->win[o->gid];
	const struct a_group *g = &j->g[o->gid];
	if (!w->m) {
		if (!(w->m = calloc(g->n ? g->n : 1, sizeof(*w->m))))
			return -ENOMEM;
		w->n = g->n;
	}
	int m = member_of(g, o->rank);
	if (m < 0)
		return 0;
	struct a_mwin *mw = &w->m[m];
	size_t pos = (size_t)o->pos;
	if (pos + 1 >= mw->len) {
		mw->last = *o;
		mw->len = pos + 1;
	}
	if (pos < w->base || (w->frozen && pos > w->base && pos >= mw->held))
		return 0; /* matched already; past a disagreement */
	if (win_room(mw, w->base, pos + 1) < 0)
		return -ENOMEM;
	for (; mw->held <= pos; mw->held++) {
		slot(mw, mw->held)->op = NULL; /* a hole until its call comes */
		j->held++;
	}
	*slot(mw, pos) = *o;
	if (j->held > j->held_peak)
		j->held_peak = j->held;
	win_advance(j, w);
	return 0;
}

/* ---- the mechanisms' summaries ---------------------------------------- */

static bool root_outside(const struct a_group *g, int k, int64_t root)
{
	bool global = k == R_SRC || k == R_DST;
	return global ? !in_list(g->ranks, g->n, root) : (root < 0 || (size_t)root >= g->n);
}

static int note_roots(struct job *j, const struct a_op *o)
{
	const struct a_group *g = &j->g[o->gid];
	int bad = -1;
	for (int k = 0; k < R_N && bad < 0; k++)
		if (o->has[k] && root_outside(g, k, o->root[k]))
			bad = k;
	if (bad >= 0) {
		uintptr_t key[4] = {(uintptr_t)o->site, (uintptr_t)o->op, (uintptr_t)bad, (uintptr_t)o->world};
		size_t *ix = kmap_get(&j->rbad_ix, key, true);
		if (!ix)
			return -ENOMEM;
		if (!*ix) {
			struct r_bad *b = push(&j->rbad, &j->nrbad, &j->caprbad, sizeof(*j->rbad));
			if (!b)
				return -ENOMEM;
			b->o = *o;
			b->k = bad;
			*ix = j->nrbad;
		}
		struct r_bad *b = &j->rbad[*ix - 1];
		if (o->lk < b->o.lk)
			b->o = *o;
		if (!in_list(b->ranks, b->nranks, o->rank)) {
			if (grow((void **)&b->ranks, &b->cap, b->nranks + 1, sizeof(int)) < 0)
				return -ENOMEM;
			b->ranks[b->nranks++] = o->rank;
		}
	}
	/* roots inside their group: the same number right on another group */
	for (int k = R_SRC; k <= R_DST; k++) {
		if (!o->has[k] || root_outside(g, k, o->root[k]))
			continue;
		uintptr_t key[5] = {(uintptr_t)o->site, (uintptr_t)o->op, (uintptr_t)k, (uintptr_t)o->root[k],
			(uintptr_t)o->gid};
		size_t *ix = kmap_get(&j->rin_ix, key, true);
		if (!ix)
			return -ENOMEM;
		if (!*ix) {
			struct r_in *r = push(&j->rin, &j->nrin, &j->caprin, sizeof(*j->rin));
			if (!r)
				return -ENOMEM;
			*r = (struct r_in){.lk = o->lk, .gid = o->gid, .rank = o->rank, .site = o->site, .op = o->op, .k = k,
				.root = o->root[k], .world = o->world};
			*ix = j->nrin;
		} else if (o->lk < j->rin[*ix - 1].lk) {
			j->rin[*ix - 1].lk = o->lk;
			j->rin[*ix - 1].rank = o->rank;
		}
	}
	/* point-to-point peers, per call site */
	int k = o->has[R_DST] ? R_DST : o->has[R_SRC] ? R_SRC : -1;
	if (o->pos >= 0 || k < 0)
		return 0;
	uintptr_t key[4] = {(uintptr_t)o->site, (uintptr_t)o->op, (uintptr_t)k, (uintptr_t)o->world};
	size_t *ix = kmap_get(&j->twin_ix, key, true);
	if (!ix)
		return -ENOMEM;
	if (!*ix) {
		struct r_twin *t = push(&j->twin, &j->ntwin, &j->captwin, sizeof(*j->twin));
		if (!t)
			return -ENOMEM;
		*t = (struct r_twin){.lk = o->lk, .site = o->site, .op = o->op, .k = k, .world = o->world};
		*ix = j->ntwin;
	}
	struct r_twin *t = &j->twin[*ix - 1];
	if (o->lk < t->lk)
		t->lk = o->lk;
	if (!in_list(g->ranks, g->n, o->root[k]))
		return 0; /* an R finding of its own */
	for (size_t i = 0; i < t->n; i++)
		if (t->pair[i][0] == o->rank && t->pair[i][1] == (int)o->root[k])
			return 0;
	if (grow((void **)&t->pair, &t->cap, t->n + 1, sizeof(*t->pair)) < 0)
		return -ENOMEM;
	t->pair[t->n][0] = o->rank;
	t->pair[t->n][1] = (int)o->root[k];
	t->n++;
	return 0;
}

/* the broadcasts of a site on a group, cut into rounds of every size d that
 * divides the world: the distinct rounds, in their order */
static int note_bcast(struct job *j, const struct a_op *o)
{
	if (o->pos < 0 || !o->has[R_SRC] || strcmp(o->op, "broadcast"))
		return 0;
	uintptr_t key[3] = {(uintptr_t)o->gid, (uintptr_t)o->rank, (uintptr_t)o->site};
	size_t *ix = kmap_get(&j->gagg_ix, key, true);
	if (!ix)
		return -ENOMEM;
	if (!*ix) {
		struct g_agg *a = push(&j->gagg, &j->ngagg, &j->capgagg, sizeof(*j->gagg));
		if (!a)
			return -ENOMEM;
		*a = (struct g_agg){.gid = o->gid, .rank = o->rank, .site = o->site, .op = o->op, .first_pos = (size_t)o->pos};
		int size = j->w[o->world].size;
		for (int d = 2; d <= size; d++)
			if (size % d == 0)
				a->nd++;
		if (!(a->d = calloc((size_t)a->nd + 1, sizeof(*a->d))))
			return -ENOMEM;
		for (int d = 2, i = 0; d <= size; d++)
			if (size % d == 0) {
				a->d[i].d = d;
				if (!(a->d[i++].cur = malloc((size_t)d * sizeof(int))))
					return -ENOMEM;
			}
		*ix = j->ngagg;
	}
	struct g_agg *a = &j->gagg[*ix - 1];
	a->nrun++;
	if ((size_t)o->pos < a->first_pos)
		a->first_pos = (size_t)o->pos;
	for (int i = 0; i < a->nd; i++) {
		struct g_div *d = &a->d[i];
		d->cur[d->ncur++] = (int)o->root[R_SRC];
		if (d->ncur < d->d)
			continue;
		d->ncur = 0;
		bool seen = false;
		for (size_t r = 0; r < d->nrounds && !seen; r++)
			seen = !memcmp(&d->rounds[r * (size_t)d->d], d->cur, (size_t)d->d * sizeof(int));
		if (seen)
			continue;
		size_t cap = d->caprounds * (size_t)d->d;
		if (grow((void **)&d->rounds, &cap, (d->nrounds + 1) * (size_t)d->d, sizeof(int)) < 0)
			return -ENOMEM;
		d->caprounds = cap / (size_t)d->d;
		memcpy(&d->rounds[d->nrounds++ * (size_t)d->d], d->cur, (size_t)d->d * sizeof(int));
	}
	return 0;
}

/* ---- one call ---------------------------------------------------------- */

int calls_add(struct job *j, const struct a_op *o)
{
	struct a_proc *p = &j->p[o->proc];
	if (!p->ring && !(p->ring = calloc(A_RING, sizeof(*p->ring))))
		return -ENOMEM;
	const struct a_op *prev = proc_call(p, 0);
	uintptr_t step[5] = {(uintptr_t)o->proc, (uintptr_t)(prev ? prev->site : NULL), (uintptr_t)(prev ? prev->op : NULL),
		(uintptr_t)o->site, (uintptr_t)o->op};
	if (!kmap_get(&j->steps, step, true))
		return -ENOMEM;
	p->ring[p->nring++ % A_RING] = *o;
	j->w[o->world].has_calls = true;
	int rc = note_roots(j, o);
	if (rc == 0 && o->pos >= 0) {
		uintptr_t key[4] = {(uintptr_t)o->gid, (uintptr_t)o->rank, (uintptr_t)o->op, (uintptr_t)o->site};
		size_t *n = kmap_get(&j->at_count, key, true);
		if (!n)
			return -ENOMEM;
		++*n;
		rc = note_bcast(j, o);
		if (rc == 0)
			rc = win_add(j, o);
	}
	return rc;
}

bool calls_step(const struct job *j, int proc, const struct a_op *prev, const struct a_op *cur)
{
	uintptr_t step[5] = {(uintptr_t)proc, (uintptr_t)(prev ? prev->site : NULL), (uintptr_t)(prev ? prev->op : NULL),
		(uintptr_t)cur->site, (uintptr_t)cur->op};
	return kmap_get((struct kmap *)&j->steps, step, false) != NULL;
}

size_t calls_at(const struct job *j, int gid, int rank, const char *op, const char *site)
{
	uintptr_t key[4] = {(uintptr_t)gid, (uintptr_t)rank, (uintptr_t)op, (uintptr_t)site};
	const size_t *n = kmap_get((struct kmap *)&j->at_count, key, false);
	return n ? *n : 0;
}

void calls_init(struct job *j)
{
	j->steps.words = 5;
	j->at_count.words = 4;
	j->rbad_ix.words = 4;
	j->rin_ix.words = 5;
	j->twin_ix.words = 4;
	j->gagg_ix.words = 3;
	j->use_seen.words = 3;
	j->cjoin.words = 2;
	j->pyjoin.words = 2;
}

void calls_release(struct job *j)
{
	for (size_t i = 0; i < j->nwin; i++) {
		for (size_t m = 0; j->win[i].m && m < j->win[i].n; m++)
			free(j->win[i].m[m].v);
		free(j->win[i].m);
	}
	free(j->win);
	for (size_t i = 0; i < j->np; i++)
		free(j->p[i].ring);
	for (size_t i = 0; i < j->nrbad; i++)
		free(j->rbad[i].ranks);
	free(j->rbad);
	free(j->rin);
	for (size_t i = 0; i < j->ntwin; i++)
		free(j->twin[i].pair);
	free(j->twin);
	for (size_t i = 0; i < j->ngagg; i++) {
		for (int d = 0; d < j->gagg[i].nd; d++) {
			free(j->gagg[i].d[d].cur);
			free(j->gagg[i].d[d].rounds);
		}
		free(j->gagg[i].d);
	}
	free(j->gagg);
	kmap_release(&j->steps);
	kmap_release(&j->at_count);
	kmap_release(&j->rbad_ix);
	kmap_release(&j->rin_ix);
	kmap_release(&j->twin_ix);
	kmap_release(&j->gagg_ix);
	kmap_release(&j->use_seen);
	kmap_release(&j->cjoin);
	kmap_release(&j->pyjoin);
}
