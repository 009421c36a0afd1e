/* dptp-run --audit, mechanism P: the members of one group disagree on its
 * collective sequence, a rank left (exited, crashed) before a collective its
 * peers entered, and, for a hang, the replica behind on a group. */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- disagreement at one position ----------------------------------- */

static int diverge_at(struct st *s, const struct a_group *g, const struct seqs *q, size_t k, bool *diverged)
{
	/* the common case first: every member made the first one's call */
	const struct a_op *first = NULL;
	bool all_same = true;
	for (size_t m = 0; m < g->n && all_same; m++)
		if (seq_at(q, m, k)) {
			if (!first)
				first = seq_at(q, m, k);
			else
				all_same = same_call(first, seq_at(q, m, k));
		}
	if (all_same)
		return 0;
	/* the largest class of identical calls is the reference */
	size_t best = 0, bestn = 0;
	for (size_t a = 0; a < g->n; a++) {
		size_t c = 0;
		if (!seq_at(q, a, k))
			continue;
		for (size_t b = 0; b < g->n; b++)
			c += seq_at(q, b, k) && same_call(seq_at(q, a, k), seq_at(q, b, k));
		if (c > bestn) {
			bestn = c;
			best = a;
		}
	}
	const struct a_op *r0 = seq_at(q, best, k), *d0 = NULL;
	int *dev = malloc((g->n + 1) * sizeof(int));
	size_t ndev = 0, nat = 0;
	if (!dev)
		return -ENOMEM;
	for (size_t m = 0; m < g->n; m++)
		if (seq_at(q, m, k)) {
			nat++;
			if (!same_call(seq_at(q, m, k), r0)) {
				dev[ndev++] = g->ranks[m];
				if (!d0)
					d0 = seq_at(q, m, k);
			}
		}
	if (bestn * 2 <= nat) /* no majority: every member is suspect */
		for (size_t m = 0; m < g->n; m++)
			if (seq_at(q, m, k) && same_call(seq_at(q, m, k), r0))
				dev[ndev++] = g->ranks[m];
	*diverged = true;
	char a[160], b[160], gr[256];
	describe_op(a, sizeof(a), d0);
	describe_op(b, sizeof(b), r0);
	fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
	int rc = add_finding(s, 'P', dev, ndev, d0->site, d0->op,
		"collective #%zu on group [%s]: rank %d called %s at %s while rank %d called %s at %s", k + 1, gr,
		d0->rank, a, d0->site, r0->rank, b, r0->site);
	if (rc == 0)
		rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	free(dev);
	return rc;
}

/* ---- counts past the cap -------------------------------------------- */

/* the calls a rank made on a group: its count record when it reached the
 * cap, else what was recorded */
static long long final_count(const struct st *s, int rank, size_t gid, size_t recorded)
{
	const struct job *j = s->j;
	long long best = (long long)recorded;
	for (size_t i = 0; i < j->ncnt; i++) {
		const struct a_count *c = &j->cnt[i];
		/* its collectives (nc); a recorder without nc: its calls (seq) */
		long long n = c->nc >= 0 ? c->nc : c->seq;
		if ((size_t)c->gid == gid && j->p[c->proc].owner >= 0 && s->r[rank].proc == c->proc && n > best)
			best = n;
	}
	return best;
}

/* A member's calls on a group, all of them: recorded ones (uncapped), or
 * recorded ones plus its count record's sum of the ones past the cap.
 * False when they cannot be known (a count without "hs", none, a C cap). */
static bool member_total(const struct st *s, int rank, size_t gid, long long *cnt, uint64_t *sum)
{
	const struct job *j = s->j;
	if (!s->r || rank < 0 || rank >= s->size || s->r[rank].proc < 0)
		return false;
	int pi = s->r[rank].proc;
	const struct a_proc *p = &j->p[pi];
	long long rec = gid < p->ncnt ? p->cnt[gid] : 0;
	uint64_t h = gid < p->ncnt ? p->hsum[gid] : 0;
	/* an NCCL communicator's calls are the C recorder's, a group's the
	 * Python one's (a Python rank's C records past their cap: unknown) */
	bool nccl = j->g[gid].nccl, capped = nccl ? p->capped_c : p->capped_py;
	if ((!nccl && p->capped_c) || (capped && !p->ended))
		return false;
	if (!capped) {
		*cnt = rec;
		*sum = h;
		return true;
	}
	for (size_t i = 0; i < j->ncnt; i++) {
		const struct a_count *c = &j->cnt[i];
		if (c->proc == pi && (size_t)c->gid == gid) {
			*cnt = c->nc >= 0 ? c->nc : c->seq;
			*sum = h + c->hs;
			return c->has_hs;
		}
	}
	return false;
}

/* every member of the group that recorded Python calls has its total */
static bool group_totals(const struct st *s, size_t gid)
{
	const struct a_group *g = &s->j->g[gid];
	long long c;
	uint64_t h;
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		if (r >= 0 && r < s->size && s->r[r].py && !member_total(s, r, gid, &c, &h))
			return false;
	}
	return true;
}

bool cap_compared(const struct st *s, int proc)
{
	const struct job *j = s->j;
	const struct a_proc *p = &j->p[proc];
	bool any = false;
	if (!s->r || (p->capped_c && p->py) || !p->ended)
		return false;
	for (size_t i = 0; i < j->ncnt; i++) {
		const struct a_count *c = &j->cnt[i];
		if (c->proc != proc)
			continue;
		if (!c->has_hs || c->gid < 0 || j->g[c->gid].world != s->world || !group_totals(s, (size_t)c->gid))
			return false;
		any = true;
	}
	return any;
}

/* Equal counts on a group whose members all have their totals: the calls
 * past the cap agree when the sums of their terms do. */
static int compare_sums(struct st *s, size_t gid, const struct seqs *q)
{
	const struct a_group *g = &s->j->g[gid];
	int *dev = malloc((g->n + 1) * sizeof(int)), *ref = malloc((g->n + 1) * sizeof(int));
	uint64_t *sum = calloc(g->n + 1, sizeof(*sum));
	bool *in = calloc(g->n + 1, sizeof(*in));
	long long cnt = -1; /* the first member's calls on the group */
	size_t best = SIZE_MAX, bestn = 0, ndev = 0, nref = 0;
	int rc = 0;
	if (!dev || !ref || !sum || !in) {
		rc = -ENOMEM;
		goto out;
	}
	if (!group_totals(s, gid))
		goto out;
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		long long c;
		if (!q->in[m] || !s->r[r].exited || s->r[r].raised || !member_total(s, r, gid, &c, &sum[m]))
			continue;
		if (cnt < 0)
			cnt = c;
		in[m] = true;
	}
	/* the largest class of equal sums is the reference */
	for (size_t a = 0; a < g->n; a++) {
		size_t n = 0;
		for (size_t b = 0; in[a] && b < g->n; b++)
			n += in[b] && sum[b] == sum[a];
		if (n > bestn) {
			bestn = n;
			best = a;
		}
	}
	const char *site = "";
	for (size_t m = 0; best != SIZE_MAX && m < g->n; m++) {
		if (!in[m])
			continue;
		if (sum[m] == sum[best]) {
			ref[nref++] = g->ranks[m];
		} else {
			if (!ndev && seq_last(q, m))
				site = seq_last(q, m)->site;
			dev[ndev++] = g->ranks[m];
		}
	}
	if (!ndev)
		goto out;
	char gr[256], dr[256], rr[256];
	fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
	fmt_ranks(dr, sizeof(dr), dev, ndev);
	fmt_ranks(rr, sizeof(rr), ref, nref);
	rc = add_finding(s, 'P', dev, ndev, site, "",
		"calls past the record cap differ in op/size/dtype/root on group [%s]: rank%s %s vs rank%s %s (%lld calls; the calls past the cap were compared by the sum of their signatures)",
		gr, ndev > 1 ? "s" : "", dr, nref > 1 ? "s" : "", rr, cnt);
	if (rc == 0)
		rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
out:
	free(dev);
	free(ref);
	free(sum);
	free(in);
	return rc;
}

static int compare_counts(struct st *s, size_t gid, const struct seqs *q)
{
	const struct a_group *g = &s->j->g[gid];
	long long lo = -1, hi = -1;
	int rlo = -1, rhi = -1;
	const char *site = "";
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		if (!q->in[m] || !s->r[r].exited || s->r[r].raised)
			continue;
		long long c = final_count(s, r, gid, q->len[m]);
		if (lo < 0 || c < lo) {
			lo = c;
			rlo = r;
			/* where it was when its calls were last kept */
			site = seq_last(q, m) ? seq_last(q, m)->site : "";
		}
		if (c > hi) {
			hi = c;
			rhi = r;
		}
	}
	if (lo < 0 || lo == hi)
		return 0;
	char gr[256];
	fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
	int rc = add_finding(s, 'P', &rlo, 1, site, "",
		"rank %d made %lld collectives on group [%s], rank %d made %lld (counted past the record cap: the calls themselves were not kept)",
		rlo, lo, gr, rhi, hi);
	if (rc == 0)
		rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	return rc;
}

/* ---- missing collectives -------------------------------------------- */

/* A missing collective: `short_ranks` never entered the one `waiting`
 * entered first. */
struct missing {
	int gid;
	const struct a_op *first; /* the earliest entry by a peer (ties: the lowest rank) */
	int *short_ranks, *waiting;
	size_t nshort, nwaiting;
};

static void free_missing(struct missing *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(m[i].short_ranks);
		free(m[i].waiting);
	}
	free(m);
}

/* "file:line" -> the file's length and the line; false without a line. */
static bool split_site(const char *site, size_t *flen, long *line)
{
	const char *c = strrchr(site, ':');
	char *end;
	if (!c || !c[1])
		return false;
	*line = strtol(c + 1, &end, 10);
	*flen = (size_t)(c - site);
	return !*end;
}

static bool same_file(const char *a, const char *b)
{
	size_t fa, fb;
	long la, lb;
	return split_site(a, &fa, &la) && split_site(b, &fb, &lb) && fa == fb && !strncmp(a, b, fa);
}

/* Has rank r simply not reached the call at `site` yet? It is blocked
 * (alive, its last call still open) at an earlier line of the same file. */
static bool behind_in_file(const struct st *s, int r, const char *site)
{
	const struct a_rank *rk = &s->r[r];
	size_t fa, fb;
	long la, lb;
	if (rk->exited || !rk->last_op)
		return false;
	const char *at = rk->last_op->site;
	if (!split_site(at, &fa, &la) || !split_site(site, &fb, &lb) || fa != fb || strncmp(at, site, fa))
		return false;
	return la < lb;
}

/* A missing collective is a consequence, not a cause, when its short ranks
 * have not reached it yet: blocked earlier in the same file, or (across
 * files) waiting in a missing collective entered before it. */
static bool consequence(const struct st *st, const struct missing *m, size_t n, size_t i)
{
	for (size_t s = 0; s < m[i].nshort; s++) {
		int r = m[i].short_ranks[s];
		bool waits = behind_in_file(st, r, m[i].first->site);
		for (size_t j = 0; j < n && !waits; j++)
			if (j != i && !same_file(m[j].first->site, m[i].first->site) && m[j].first->t < m[i].first->t &&
			    in_list(m[j].waiting, m[j].nwaiting, r))
				waits = true;
		if (!waits)
			return false;
	}
	return true;
}

static int collect_missing(struct st *s, size_t gid, const struct seqs *q, size_t minlen, size_t maxlen, bool hung,
			   struct missing **miss, size_t *nmiss, size_t *capm)
{
	const struct a_group *g = &s->j->g[gid];
	for (size_t k = minlen; k < maxlen; k++) {
		struct missing mm = {.gid = (int)gid};
		mm.short_ranks = malloc(g->n * sizeof(int));
		mm.waiting = malloc(g->n * sizeof(int));
		if (!mm.short_ranks || !mm.waiting) {
			free(mm.short_ranks);
			free(mm.waiting);
			return -ENOMEM;
		}
		for (size_t m = 0; m < g->n; m++) {
			int r = g->ranks[m];
			if (!q->in[m])
				continue;
			if (q->len[m] > k) {
				const struct a_op *o = seq_at(q, m, k);
				mm.waiting[mm.nwaiting++] = r;
				if (o && (!mm.first || o->t < mm.first->t))
					mm.first = o;
			} else if (q->len[m] == k && (!s->r[r].raised || s->r[r].call_failed) && !s->r[r].capped &&
				   (hung || s->r[r].exited)) {
				/* a rank that raised in its own code stopped short for that reason;
				 * one whose call failed (a timeout) waited somewhere else */
				mm.short_ranks[mm.nshort++] = r;
			}
		}
		if (!mm.nshort || !mm.first || grow((void **)miss, capm, *nmiss + 1, sizeof(**miss)) < 0) {
			free(mm.short_ranks);
			free(mm.waiting);
			continue;
		}
		(*miss)[(*nmiss)++] = mm;
	}
	return 0;
}

static void how_exited(const struct st *s, int r, char *buf, size_t len)
{
	const struct a_rank *rk = &s->r[r];
	if (rk->sig)
		snprintf(buf, len, " (it ended by signal %d%s)", rk->sig, rk->core ? ", core dumped" : "");
	else if (rk->exited)
		snprintf(buf, len, " (it exited)");
	else
		buf[0] = '\0';
}

static int report_missing(struct st *s, const struct missing *m, size_t n, bool hung)
{
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (consequence(s, m, n, i))
			continue;
		const struct a_group *g = &s->j->g[m[i].gid];
		char a[160], gr[256], sr[256], wr[256], how[64];
		describe_op(a, sizeof(a), m[i].first);
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		fmt_ranks(sr, sizeof(sr), m[i].short_ranks, m[i].nshort);
		fmt_ranks(wr, sizeof(wr), m[i].waiting, m[i].nwaiting);
		how_exited(s, m[i].short_ranks[0], how, sizeof(how));
		rc = add_finding(s, 'P', m[i].short_ranks, m[i].nshort, m[i].first->site, m[i].first->op,
			"rank%s %s never entered %s at %s on group [%s], which rank%s %s entered%s%s", m[i].nshort > 1 ? "s" : "",
			sr, a, m[i].first->site, gr, m[i].nwaiting > 1 ? "s" : "", wr, m[i].nshort == 1 ? how : "",
			hung ? "; no rank progressed after that (the audit ended the hung job)" : "");
		if (rc == 0)
			rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	}
	return rc;
}

int find_p(struct st *s, bool hung)
{
	struct missing *miss = NULL;
	size_t nmiss = 0, capm = 0;
	int rc = 0;
	bool capped = false;
	for (int r = 0; r < s->size; r++)
		capped |= s->r[r].capped;
	for (size_t gi = 0; gi < s->ngorder && rc == 0; gi++) {
		size_t gid = s->gorder[gi];
		const struct a_group *g = &s->j->g[gid];
		struct seqs q = {0};
		size_t nrec = 0, maxlen = 0, minlen = SIZE_MAX;
		if ((rc = build_seqs(s, (int)gid, &q)) < 0) {
			free_seqs(&q);
			break;
		}
		for (size_t m = 0; m < g->n; m++)
			if (q.in[m]) {
				nrec++;
				if (q.len[m] > maxlen)
					maxlen = q.len[m];
				if (q.len[m] < minlen)
					minlen = q.len[m];
			}
		bool diverged = false;
		/* the positions below q.base matched on every member as they came */
		for (size_t k = q.base; nrec >= 2 && k < minlen && !diverged && rc == 0; k++)
			rc = diverge_at(s, g, &q, k, &diverged);
		size_t nf0 = s->out->nf;
		if (rc == 0 && !diverged && nrec >= 2 && capped)
			rc = compare_counts(s, gid, &q);
		if (rc == 0 && !diverged && nrec >= 2 && capped && s->out->nf == nf0)
			rc = compare_sums(s, gid, &q);
		if (rc == 0 && !diverged && nrec >= 2 && minlen < maxlen)
			rc = collect_missing(s, gid, &q, minlen, maxlen, hung, &miss, &nmiss, &capm);
		free_seqs(&q);
	}
	if (rc == 0 && hung) {
		char msg[8];
		int b = hang_blame(s, true, msg, sizeof(msg));
		if (b < 0)
			rc = b;
		else if (b == 1)
			nmiss = (free_missing(miss, nmiss), miss = NULL, 0);
	}
	if (rc == 0)
		rc = report_missing(s, miss, nmiss, hung);
	free_missing(miss, nmiss);
	return rc;
}

/* ---- the hang: who is behind ---------------------------------------- */

struct cand {
	size_t gid;
	int *behind;
	size_t nbehind;
	const struct a_op *ref; /* the open call the others wait in */
	bool primary;
};

static int add_trail(struct st *s, struct audit_finding *f, const struct a_group *g)
{
	const struct job *j = s->j;
	f->trail = calloc(g->n ? g->n : 1, sizeof(*f->trail));
	if (!f->trail)
		return -ENOMEM;
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		struct audit_trail *t = &f->trail[f->ntrail++];
		t->rank = r;
		if (r < 0 || r >= s->size)
			continue;
		t->pid = s->r[r].pid;
		const struct a_op *last = s->r[r].last_op;
		enum { KEEP = 5 };
		if (!(t->c = calloc(KEEP, sizeof(*t->c))))
			return -ENOMEM;
		if (!last)
			continue;
		const struct a_proc *p = &j->p[last->proc];
		size_t from = 0;
		while (from + 1 < KEEP && proc_call(p, from + 1))
			from++;
		for (size_t b = from + 1; b-- > 0;) {
			const struct a_op *o = proc_call(p, b);
			struct audit_call *c = &t->c[t->n++];
			c->seq = o->seq ? o->seq : o->pos + 1;
			snprintf(c->op, sizeof(c->op), "%s", o->op);
			fmt_ranks(c->group, sizeof(c->group), j->g[o->gid].ranks, j->g[o->gid].n);
			snprintf(c->site, sizeof(c->site), "%s", o->site);
			c->open = !o->done;
		}
	}
	return 0;
}

static int blame_one(struct st *s, const struct cand *c, const struct seqs *q, bool add, char *msg, size_t len,
		     size_t *off)
{
	const struct a_group *g = &s->j->g[c->gid];
	char gr[256], text[1024];
	size_t t = 0;
	fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
	/* the ones behind first, then the others, each with its count */
	for (int pass = 0; pass < 2; pass++)
		for (size_t m = 0; m < g->n && t < sizeof(text); m++) {
			int r = g->ranks[m];
			if (!q->in[m] || in_list(c->behind, c->nbehind, r) != (pass == 0))
				continue;
			size_t n = calls_at(s->j, (int)c->gid, r, c->ref->op, c->ref->site);
			if (!t)
				t += (size_t)snprintf(text + t, sizeof(text) - t, "rank %d %sentered %zu %s on group [%s] at %s", r,
					s->r[r].exited ? "exited after it " : "", n, c->ref->op, gr, c->ref->site);
			else
				t += (size_t)snprintf(text + t, sizeof(text) - t, ", rank %d %sentered %zu", r,
					s->r[r].exited && pass == 0 ? "exited after it " : "", n);
		}
	int rep = replica_of(s->out, c->behind[0]);
	bool one_rep = rep >= 0;
	for (size_t i = 1; i < c->nbehind; i++)
		one_rep &= replica_of(s->out, c->behind[i]) == rep;
	char who[96];
	if (one_rep)
		snprintf(who, sizeof(who), "replica %d is behind on this group", rep);
	else
		snprintf(who, sizeof(who), "rank%s behind on this group", c->nbehind > 1 ? "s are" : " is");
	if (*off < len)
		*off += (size_t)snprintf(msg + *off, len - *off, "%s%s: %s", *off ? "; " : "", text, who);
	if (!add)
		return 0;
	int rc = add_finding(s, 'P', c->behind, c->nbehind, c->ref->site, c->ref->op,
		"hang: %s: %s; the others wait in their call #%lld there (the audit ended the hung job)", text, who,
		c->ref->seq ? c->ref->seq : (long long)c->ref->pos + 1);
	if (rc == 0)
		rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	if (rc == 0)
		rc = add_trail(s, &s->out->f[s->out->nf - 1], g);
	return rc;
}

/* Did rank b come to its open call by a step (previous call -> this one)
 * that no other rank of the world took (outside `skip`)? The one that
 * skipped or added a call took a step the others never took; a rank that
 * waits for it came by the program's usual path. */
static bool novel_step(const struct st *s, int b, const int *skip, size_t nskip)
{
	const struct job *j = s->j;
	const struct a_op *cur = s->r[b].last_op;
	if (!cur)
		return false;
	const struct a_op *prev = proc_call(&j->p[cur->proc], 1);
	for (int x = 0; x < s->size; x++) {
		const struct a_op *k = s->r[x].last_op;
		if (x == b || !k || in_list(skip, nskip, x))
			continue;
		if (calls_step(j, k->proc, prev, cur))
			return false;
	}
	return true;
}

/* No one behind, but two members wait in different calls at the same place
 * of one group (a P divergence find_p reports): 1 with msg, else 2. */
static int open_mismatch(struct st *s, char *msg, size_t len)
{
	const struct job *j = s->j;
	for (int a = 0; a < s->size; a++) {
		const struct a_op *ka = s->r[a].last_op;
		if (!ka || s->r[a].exited || ka->pos < 0)
			continue;
		for (int b = a + 1; b < s->size; b++) {
			const struct a_op *kb = s->r[b].last_op;
			if (!kb || s->r[b].exited || kb->gid != ka->gid || kb->pos != ka->pos || same_call(ka, kb))
				continue;
			const struct a_group *g = &j->g[ka->gid];
			char gr[256], x[160], y[160];
			fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
			describe_op(x, sizeof(x), ka);
			describe_op(y, sizeof(y), kb);
			if (len)
				snprintf(msg, len, "call #%d on group [%s]: rank %d waits in %s at %s, rank %d in %s at %s",
					ka->pos + 1, gr, a, x, ka->site, b, y, kb->site);
			return 1;
		}
	}
	return 2;
}

int hang_blame(struct st *s, bool add, char *msg, size_t len)
{
	const struct job *j = s->j;
	struct cand *cv = NULL;
	size_t nc = 0, capc = 0, off = 0;
	int rc = 0, any = 0;
	if (len)
		msg[0] = '\0';
	/* every live rank inside a collective it entered and has not left */
	for (int r = 0; r < s->size; r++) {
		const struct a_rank *rk = &s->r[r];
		if (!rk->rec || rk->exited)
			continue;
		if (rk->nccl) /* no Python records: inside while its last record is an NCCL call */
			continue;
		if (!rk->last_op || rk->last_op->done)
			return 0; /* working */
		any = 1;
	}
	if (!any)
		return 2;
	for (size_t gi = 0; gi < s->ngorder && rc == 0; gi++) {
		size_t gid = s->gorder[gi];
		const struct a_group *g = &j->g[gid];
		struct seqs q = {0};
		if ((rc = build_seqs(s, (int)gid, &q)) < 0) {
			free_seqs(&q);
			break;
		}
		/* the open calls on this group and the most entered */
		const struct a_op *ref = NULL;
		size_t maxc = 0;
		for (size_t m = 0; m < g->n; m++) {
			int r = g->ranks[m];
			if (!q.in[m] || s->r[r].exited || !s->r[r].last_op)
				continue;
			const struct a_op *o = s->r[r].last_op;
			if (o->gid == (int)gid && o->pos >= 0 && !o->done && (size_t)o->pos + 1 > maxc) {
				maxc = (size_t)o->pos + 1;
				ref = o;
			}
		}
		struct cand c = {.gid = gid, .ref = ref, .primary = true};
		if (ref && !(c.behind = malloc(g->n * sizeof(int))))
			rc = -ENOMEM;
		for (size_t m = 0; ref && c.behind && m < g->n; m++) {
			int r = g->ranks[m];
			if (!q.in[m] || q.len[m] >= maxc)
				continue;
			c.behind[c.nbehind++] = r;
		}
		/* the ones behind left, or took a step no other rank took */
		for (size_t i = 0; i < c.nbehind; i++)
			c.primary &= s->r[c.behind[i]].exited || novel_step(s, c.behind[i], c.behind, c.nbehind);
		if (c.nbehind && grow((void **)&cv, &capc, nc + 1, sizeof(*cv)) == 0)
			cv[nc++] = c;
		else
			free(c.behind);
		free_seqs(&q);
	}
	if (!nc && rc == 0)
		return open_mismatch(s, msg, len);
	/* the primary ones; else the smallest groups: deterministic */
	bool have_primary = false;
	size_t minn = SIZE_MAX;
	for (size_t i = 0; i < nc; i++) {
		have_primary |= cv[i].primary;
		if (j->g[cv[i].gid].n < minn)
			minn = j->g[cv[i].gid].n;
	}
	int found = 0;
	for (size_t i = 0; i < nc && rc == 0; i++) {
		if (have_primary ? !cv[i].primary : j->g[cv[i].gid].n != minn)
			continue;
		struct seqs q = {0};
		if ((rc = build_seqs(s, (int)cv[i].gid, &q)) == 0)
			rc = blame_one(s, &cv[i], &q, add, msg, len, &off);
		free_seqs(&q);
		found = 1;
	}
	for (size_t i = 0; i < nc; i++)
		free(cv[i].behind);
	free(cv);
	return rc < 0 ? rc : found ? 1 : 2;
}
