/* dptp-run --audit, mechanism G: a resource of one replica set up or used
 * over a group that spans replicas:
 *  - a loop of broadcasts over such a group whose sources are not one per
 *    replica (the dispatch broadcast on the EP group instead of the DP one);
 *  - a per-replica socket or segment used by a rank of another replica;
 *  - GPU memory (a CUDA IPC handle, a VMM shareable handle) of one replica
 *    mapped by a rank of another: exporter and importer match by `h`. */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* G (a): a loop that broadcasts one slice per DP replica over a group
 * spanning replicas: each round's sources must come one from each replica. */
static int bcast_round(struct st *s, const struct a_group *g, const int *srcs, const char *site, const char *op,
		       int dp, bool *found)
{
	const struct audit_result *res = s->out;
	int *have = calloc((size_t)dp, sizeof(int));
	int *victims = malloc((g->n + 1) * sizeof(int));
	bool distinct = true, covers = true;
	int rc = 0;
	if (!have || !victims) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < dp; i++) {
		for (int k = 0; k < i; k++)
			distinct &= srcs[k] != srcs[i];
		int d = replica_of(res, srcs[i]);
		if (d >= 0)
			have[d]++;
	}
	for (int d = 0; d < dp; d++)
		covers &= have[d] == 1;
	if (!distinct || covers)
		goto out;
	size_t nv = 0;
	for (size_t m = 0; m < g->n; m++) {
		int d = replica_of(res, g->ranks[m]);
		if (d >= 0 && !have[d])
			victims[nv++] = g->ranks[m];
	}
	char gr[256], sr[256];
	fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
	fmt_ranks(sr, sizeof(sr), srcs, (size_t)dp);
	rc = add_finding(s, 'G', victims, nv, site, op,
		"a loop of %d broadcasts over group [%s], which spans replicas, takes its sources from ranks %s: not one per replica, so the slices of the replicas with none are another replica's data (the dispatch broadcast on the EP group instead of the DP group)",
		dp, gr, sr);
	if (rc == 0)
		rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	*found = true;
out:
	free(have);
	free(victims);
	return rc;
}

static int cmp_first(const void *a, const void *b)
{
	const struct g_agg *x = *(const struct g_agg *const *)a, *y = *(const struct g_agg *const *)b;
	return (x->first_pos > y->first_pos) - (x->first_pos < y->first_pos);
}

/* per site of the member with the most calls on the group: its broadcasts
 * in rounds of dp (calls.c keeps the distinct rounds, in order) */
static int g_loop(struct st *s)
{
	const struct audit_result *res = s->out;
	const struct job *j = s->j;
	int rc = 0, dp = res->layout_known ? res->layout.dp : 0;
	if (dp < 2)
		return 0;
	const struct g_agg **v = malloc((j->ngagg + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t gi = 0; gi < s->ngorder && rc == 0; gi++) {
		size_t gid = s->gorder[gi];
		const struct a_group *g = &j->g[gid];
		if (!group_spans_replicas(s, g))
			continue;
		struct seqs q = {0};
		size_t ref = SIZE_MAX, n = 0;
		if ((rc = build_seqs(s, (int)gid, &q)) < 0) {
			free_seqs(&q);
			break;
		}
		for (size_t m = 0; m < g->n; m++)
			if (q.in[m] && (ref == SIZE_MAX || q.len[m] > q.len[ref]))
				ref = m;
		free_seqs(&q);
		if (ref == SIZE_MAX)
			continue;
		for (size_t i = 0; i < j->ngagg; i++)
			if ((size_t)j->gagg[i].gid == gid && j->gagg[i].rank == g->ranks[ref])
				v[n++] = &j->gagg[i];
		if (n > 1)
			qsort(v, n, sizeof(*v), cmp_first);
		for (size_t i = 0; i < n && rc == 0; i++) {
			const struct g_agg *a = v[i];
			const struct g_div *d = NULL;
			for (int k = 0; k < a->nd; k++)
				if (a->d[k].d == dp)
					d = &a->d[k];
			if (!d || a->nrun % (size_t)dp)
				continue;
			bool found = false;
			for (size_t r = 0; r < d->nrounds && rc == 0 && !found; r++)
				rc = bcast_round(s, g, &d->rounds[r * (size_t)dp], a->site, a->op, dp, &found); /* one per site */
		}
	}
	free(v);
	return rc;
}

/* The segments CUDA IPC itself opens beside a shared GPU buffer: libcuda's
 * (/cuda.shm.<dev>.<pid>.<n>) and torch's reference counter
 * (/torch_<pid>_<n>_<n>): part of a GPU finding, not findings of their own. */
static bool gpu_bookkeeping(const char *key)
{
	return !strncmp(key, "/cuda.shm.", 10) || !strncmp(key, "/torch_", 7);
}

/* G (b): one owner, users in other replicas */
static int g_names(struct st *s, const struct name_use *u, size_t n, bool gpu_found)
{
	const struct audit_result *res = s->out;
	int rc = 0;
	int *cross = malloc(((size_t)s->size + 1) * sizeof(int));
	if (!cross)
		return -ENOMEM;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (u[i].no != 1 || !u[i].nu || name_collides(&u[i]) || (gpu_found && gpu_bookkeeping(u[i].key)))
			continue;
		int d0 = replica_of(res, u[i].owners[0]);
		size_t nc = 0;
		for (size_t k = 0; k < u[i].nu; k++) {
			int d = replica_of(res, u[i].users[k]);
			if (d >= 0 && d0 >= 0 && d != d0)
				cross[nc++] = u[i].users[k];
		}
		if (!nc)
			continue;
		char us[256], from[200];
		fmt_ranks(us, sizeof(us), cross, nc);
		called_from(from, sizeof(from), u[i].usite, u[i].uouter);
		rc = add_finding(s, 'G', cross, nc, u[i].usite, u[i].unix_name ? "connect" : "shm_open",
			"%s '%s' of rank %d (replica %d) used by rank%s %s of another replica%s: a per-replica resource set up over a group that spans replicas",
			u[i].unix_name ? "socket" : "shared-memory segment", u[i].key, u[i].owners[0], d0, nc > 1 ? "s" : "", us,
			from);
	}
	free(cross);
	return rc;
}

/* G (c): GPU memory mapped across replicas */
static int cmp_gpu(const void *a, const void *b, void *arg)
{
	const struct a_gpu *g = arg, *x = &g[*(const size_t *)a], *y = &g[*(const size_t *)b];
	int c = x->h == y->h ? 0 : strcmp(x->h, y->h); /* by content: the same report whatever the allocations */
	if (c)
		return c;
	size_t i = *(const size_t *)a, k = *(const size_t *)b;
	return (i > k) - (i < k);
}

static const char *gpu_api(const char *call)
{
	return !strcmp(call, "ipc_open") ? "cudaIpcOpenMemHandle" : !strcmp(call, "ipc_get") ? "cudaIpcGetMemHandle"
	     : !strcmp(call, "vmm_import") ? "cuMemImportFromShareableHandle" : "cuMemExportToShareableHandle";
}

static int g_gpu(struct st *s)
{
	const struct job *j = s->j;
	const struct audit_result *res = s->out;
	size_t n = 0;
	int rc = 0;
	size_t *idx = malloc((j->ngpu + 1) * sizeof(*idx));
	int *ranks = malloc(((size_t)s->size * 2 + 2) * sizeof(int));
	const char **done_sites = calloc(j->ngpu + 1, sizeof(*done_sites));
	const struct a_gpu **ex_of = calloc(j->ngpu + 1, sizeof(*ex_of));
	size_t ndone = 0;
	if (!idx || !ranks || !done_sites || !ex_of) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < j->ngpu; i++)
		if (j->gpu[i].world == s->world && j->gpu[i].rc == 0 && j->gpu[i].h[0] && j->gpu[i].rank >= 0)
			idx[n++] = i;
	if (n > 1)
		qsort_r(idx, n, sizeof(*idx), cmp_gpu, j->gpu);
	/* per handle: its exporter (the first) and the importers of another
	 * replica; one finding per importing site */
	for (size_t i = 0; i < n && rc == 0;) {
		size_t e = i + 1;
		while (e < n && j->gpu[idx[e]].h == j->gpu[idx[i]].h)
			e++;
		const struct a_gpu *ex = NULL;
		for (size_t k = i; k < e && !ex; k++)
			if (j->gpu[idx[k]].exp)
				ex = &j->gpu[idx[k]];
		for (size_t k = i; k < e; k++)
			ex_of[k] = ex;
		i = e;
	}
	for (size_t i = 0; i < n && rc == 0;) {
		size_t e = i + 1;
		while (e < n && j->gpu[idx[e]].h == j->gpu[idx[i]].h)
			e++;
		const struct a_gpu *ex = ex_of[i];
		for (size_t k = i; ex && k < e && rc == 0; k++) {
			const struct a_gpu *im = &j->gpu[idx[k]];
			int de = replica_of(res, ex->rank), di = replica_of(res, im->rank);
			if (im->exp || de < 0 || di < 0 || de == di)
				continue;
			bool seen = false;
			for (size_t d = 0; d < ndone && !seen; d++)
				seen = done_sites[d] == im->site;
			if (seen)
				continue;
			done_sites[ndone++] = im->site;
			/* every importer of another replica at this site, and its exporters */
			size_t nr = 0, nmap = 0;
			for (size_t a = k; a < n; a++) {
				const struct a_gpu *x = &j->gpu[idx[a]];
				if (x->exp || x->site != im->site)
					continue;
				const struct a_gpu *xe = ex_of[a];
				if (!xe || replica_of(res, xe->rank) < 0 || replica_of(res, xe->rank) == replica_of(res, x->rank))
					continue;
				nmap++;
				if (!in_list(ranks, nr, x->rank))
					ranks[nr++] = x->rank;
				if (!in_list(ranks, nr, xe->rank))
					ranks[nr++] = xe->rank;
			}
			char from[200];
			called_from(from, sizeof(from), im->site, im->outer);
			rc = add_finding(s, 'G', ranks, nr, im->site[0] ? im->site : ex->site, gpu_api(im->call),
				"%zu mapping%s of another replica's GPU memory here%s, e.g. rank %d (replica %d) maps GPU memory of rank %d (replica %d) (%s of a handle from %s at %s): a per-replica GPU workspace shared across replicas",
				nmap, nmap == 1 ? "" : "s", from, im->rank, di, ex->rank, de, gpu_api(im->call), gpu_api(ex->call),
				ex->site[0] ? ex->site : "?");
		}
		i = e;
	}
out:
	free(idx);
	free(ranks);
	free(done_sites);
	free(ex_of);
	return rc;
}

int find_g(struct st *s, const struct name_use *u, size_t n)
{
	size_t before = s->out->nf;
	int rc = g_gpu(s);
	if (rc == 0)
		rc = g_names(s, u, n, s->out->nf > before);
	if (rc == 0)
		rc = g_loop(s);
	return rc;
}
