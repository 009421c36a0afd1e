/* dptp-run --audit, mechanism R: a src/dst outside the call's group (a
 * group-local root passed as a global rank, or the reverse), and its silent
 * twin: point-to-point calls of one site whose peers, the same numbers on
 * every replica, all lie in one replica. One finding per (site, op). */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_rbad(const void *a, const void *b)
{
	const struct r_bad *x = *(const struct r_bad *const *)a, *y = *(const struct r_bad *const *)b;
	return (x->o.lk > y->o.lk) - (x->o.lk < y->o.lk);
}

static int cmp_twin(const void *a, const void *b)
{
	const struct r_twin *x = *(const struct r_twin *const *)a, *y = *(const struct r_twin *const *)b;
	return (x->lk > y->lk) - (x->lk < y->lk);
}

/* the ranks in the world, in place; their number */
static size_t in_world(const struct st *s, int *ranks, const int *from, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (from[i] >= 0 && from[i] < s->size)
			ranks[k++] = from[i];
	return k;
}

/* the calls of one site with a root outside their group (calls.c's summary:
 * per site, op and root key, the first such call and the ranks) */
static int bad_roots(struct st *s, int *ranks)
{
	const struct job *j = s->j;
	const struct r_bad **v = malloc((j->nrbad + 1) * sizeof(*v));
	size_t n = 0;
	int rc = 0;
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < j->nrbad; i++)
		if (j->rbad[i].o.world == s->world)
			v[n++] = &j->rbad[i];
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_rbad);
	for (size_t i = 0; i < n && rc == 0; i++) {
		const struct a_op *o = &v[i]->o;
		const struct a_group *g = &j->g[o->gid];
		int bad_k = v[i]->k;
		size_t nr = in_world(s, ranks, v[i]->ranks, v[i]->nranks);
		if (!nr || o->rank < 0 || o->rank >= s->size)
			continue;
		char gr[256], lucky[160] = "";
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		/* the same number right elsewhere: by coincidence (the first in the files) */
		const struct r_in *best = NULL;
		for (size_t k = 0; k < j->nrin && (bad_k == R_SRC || bad_k == R_DST); k++) {
			const struct r_in *p = &j->rin[k];
			if (p->world == s->world && p->gid != o->gid && p->k == bad_k && p->root == o->root[bad_k] &&
			    p->site == o->site && p->op == o->op && p->rank >= 0 && p->rank < s->size && (!best || p->lk < best->lk))
				best = p;
		}
		if (best) {
			const struct a_group *pg = &j->g[best->gid];
			char pr[128];
			fmt_ranks(pr, sizeof(pr), pg->ranks, pg->n);
			snprintf(lucky, sizeof(lucky), "; on group [%s] (replica %d) the same %s=%lld is right, by coincidence", pr,
				replica_of(s->out, best->rank), root_key[bad_k], (long long)best->root);
		}
		if (bad_k == R_SRC || bad_k == R_DST)
			rc = add_finding(s, 'R', ranks, nr, o->site, o->op,
				"%s=%lld is not a member of group [%s]: a group-local root passed where torch wants a global rank (torch: \"Global rank %lld is not part of group\")%s",
				root_key[bad_k], (long long)o->root[bad_k], gr, (long long)o->root[bad_k], lucky);
		else
			rc = add_finding(s, 'R', ranks, nr, o->site, o->op,
				"group_%s=%lld is no index of group [%s] (size %zu): a global rank passed where torch wants a group-local one",
				bad_k == R_GSRC ? "src" : "dst", (long long)o->root[bad_k], gr, g->n);
		if (rc == 0)
			rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	}
	free(v);
	return rc;
}

/* the silent twin: point-to-point calls of one site whose peers, the same
 * numbers on every replica, all lie in one replica */
static int twins(struct st *s, int *ranks)
{
	const struct job *j = s->j;
	const struct audit_result *res = s->out;
	int rc = 0;
	if (!res->layout_known || res->layout.dp < 2)
		return 0;
	bool *seen = calloc((size_t)res->layout.dp, sizeof(*seen));
	const struct r_twin **v = malloc((j->ntwin + 1) * sizeof(*v));
	size_t n = 0;
	if (!seen || !v) {
		free(seen);
		free(v);
		return -ENOMEM;
	}
	for (size_t i = 0; i < j->ntwin; i++)
		if (j->twin[i].world == s->world)
			v[n++] = &j->twin[i];
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_twin);
	for (size_t i = 0; i < n && rc == 0; i++) {
		const struct r_twin *t = v[i];
		int callers = 0, peer_rep = -2, ncall_reps = 0, k = t->k;
		bool one_peer_rep = true;
		size_t nr = 0;
		memset(seen, 0, (size_t)res->layout.dp * sizeof(*seen));
		for (size_t x = 0; x < t->n; x++) {
			int rank = t->pair[x][0], peer = t->pair[x][1];
			if (rank < 0 || rank >= s->size)
				continue;
			int dr = replica_of(res, rank), dp = replica_of(res, peer);
			if (dr < 0 || dp < 0)
				continue;
			if (peer_rep == -2)
				peer_rep = dp;
			one_peer_rep &= dp == peer_rep;
			if (!seen[dr]) {
				seen[dr] = true;
				ncall_reps++;
			}
			if (dr != dp && !in_list(ranks, nr, rank))
				ranks[nr++] = rank;
			callers++;
		}
		if (callers && ncall_reps > 1 && one_peer_rep && nr)
			rc = add_finding(s, 'R', ranks, nr, t->site, t->op,
				"every replica passes the same %s to %s at %s: all of them are ranks of replica %d, right there by coincidence (a group-local peer used as a global rank)",
				root_key[k], t->op, t->site, peer_rep);
	}
	free(seen);
	free(v);
	return rc;
}

int find_r(struct st *s)
{
	int *ranks = malloc(((size_t)s->size + 1) * sizeof(int));
	int rc = ranks ? bad_roots(s, ranks) : -ENOMEM;
	if (rc == 0)
		rc = twins(s, ranks);
	free(ranks);
	return rc;
}
