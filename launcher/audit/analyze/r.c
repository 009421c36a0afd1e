/* dptp-run --audit, mechanism R: a src/dst outside the call's group (a
 * group-local root passed as a global rank, or the reverse), and its silent
 * twin: point-to-point calls of one site whose peers, the same numbers on
 * every replica, all lie in one replica. One finding per (site, op). */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool root_outside(const struct a_group *g, int k, int64_t root)
{
	bool global = k == R_SRC || k == R_DST;
	return global ? !in_list(g->ranks, g->n, root) : (root < 0 || (size_t)root >= g->n);
}

static int bad_roots(struct st *s, bool *done, int *ranks)
{
	const struct job *j = s->j;
	int rc = 0;
	for (size_t ii = 0; ii < s->nwops && rc == 0; ii++) {
		const struct a_op *o = &j->op[s->wops[ii]];
		const struct a_group *g = &j->g[o->gid];
		int bad_k = -1;
		if (done[ii])
			continue;
		for (int k = 0; k < R_N && bad_k < 0; k++)
			if (o->has[k] && root_outside(g, k, o->root[k]))
				bad_k = k;
		if (bad_k < 0)
			continue;
		size_t nr = 0;
		for (size_t jj = ii; jj < s->nwops; jj++) {
			const struct a_op *p = &j->op[s->wops[jj]];
			if (done[jj] || p->site != o->site || strcmp(p->op, o->op) || !p->has[bad_k] ||
			    !root_outside(&j->g[p->gid], bad_k, p->root[bad_k]))
				continue;
			done[jj] = true;
			if (!in_list(ranks, nr, p->rank))
				ranks[nr++] = p->rank;
		}
		char gr[256], lucky[160] = "";
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		/* the same number right elsewhere: by coincidence */
		for (size_t jj = 0; jj < s->nwops && !lucky[0] && (bad_k == R_SRC || bad_k == R_DST); jj++) {
			const struct a_op *p = &j->op[s->wops[jj]];
			const struct a_group *pg = &j->g[p->gid];
			if (p->gid != o->gid && p->has[bad_k] && p->root[bad_k] == o->root[bad_k] && p->site == o->site &&
			    !strcmp(p->op, o->op) && in_list(pg->ranks, pg->n, p->root[bad_k])) {
				char pr[128];
				fmt_ranks(pr, sizeof(pr), pg->ranks, pg->n);
				snprintf(lucky, sizeof(lucky), "; on group [%s] (replica %d) the same %s=%lld is right, by coincidence", pr,
					replica_of(s->out, p->rank), root_key[bad_k], (long long)p->root[bad_k]);
			}
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
	return rc;
}

/* the silent twin: point-to-point calls of one site whose peers, the same
 * numbers on every replica, all lie in one replica */
static int twins(struct st *s, bool *done, int *ranks)
{
	const struct job *j = s->j;
	const struct audit_result *res = s->out;
	int rc = 0;
	if (!res->layout_known || res->layout.dp < 2)
		return 0;
	memset(done, 0, s->nwops * sizeof(*done));
	bool *seen = calloc((size_t)res->layout.dp, sizeof(*seen));
	if (!seen)
		return -ENOMEM;
	for (size_t ii = 0; ii < s->nwops && rc == 0; ii++) {
		const struct a_op *o = &j->op[s->wops[ii]];
		int k = o->has[R_DST] ? R_DST : o->has[R_SRC] ? R_SRC : -1;
		if (done[ii] || o->pos >= 0 || k < 0)
			continue;
		int callers = 0, peer_rep = -2, ncall_reps = 0;
		bool one_peer_rep = true;
		size_t nr = 0;
		memset(seen, 0, (size_t)res->layout.dp * sizeof(*seen));
		for (size_t jj = ii; jj < s->nwops; jj++) {
			const struct a_op *p = &j->op[s->wops[jj]];
			if (done[jj] || p->pos >= 0 || p->site != o->site || strcmp(p->op, o->op) || !p->has[k])
				continue;
			done[jj] = true;
			const struct a_group *pg = &j->g[p->gid];
			int peer = (int)p->root[k];
			if (!in_list(pg->ranks, pg->n, peer))
				continue; /* reported above */
			int dr = replica_of(res, p->rank), dp = replica_of(res, peer);
			if (dr < 0 || dp < 0)
				continue;
			if (peer_rep == -2)
				peer_rep = dp;
			one_peer_rep &= dp == peer_rep;
			if (!seen[dr]) {
				seen[dr] = true;
				ncall_reps++;
			}
			if (dr != dp && !in_list(ranks, nr, p->rank))
				ranks[nr++] = p->rank;
			callers++;
		}
		if (callers && ncall_reps > 1 && one_peer_rep && nr)
			rc = add_finding(s, 'R', ranks, nr, o->site, o->op,
				"every replica passes the same %s to %s at %s: all of them are ranks of replica %d, right there by coincidence (a group-local peer used as a global rank)",
				root_key[k], o->op, o->site, peer_rep);
	}
	free(seen);
	return rc;
}

int find_r(struct st *s)
{
	bool *done = calloc(s->nwops ? s->nwops : 1, sizeof(*done));
	int *ranks = malloc(((size_t)s->size + 1) * sizeof(int));
	int rc = done && ranks ? bad_roots(s, done, ranks) : -ENOMEM;
	if (rc == 0)
		rc = twins(s, done, ranks);
	free(done);
	free(ranks);
	return rc;
}
