/* dptp-run --audit: the analysis (audit_analyze.h), world by world. */
#include "audit/analyze/model.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/audit_rec.h"

/* ---- one world ------------------------------------------------------- */

static int rank_device(const struct a_proc *p)
{
	if (p->dev_set >= 0)
		return p->dev_set;
	if (p->dev_tensor >= 0)
		return p->dev_tensor;
	if (p->dev_nccl >= 0)
		return p->dev_nccl;
	return p->py ? -1 : p->dev_c;
}

/* the world and rank of a process's own records, -1 none */
static int proc_rank_in(const struct a_proc *p, int w)
{
	for (int k = 0; k < p->nw; k++)
		if (p->w[k] == w)
			return p->wrank[k];
	return !p->nw && p->home_w == w ? p->home_rank : -1;
}

/* A program whose ranks make no Python records (C++ over NCCL): each
 * communicator whose members all recorded its creation is a group, in
 * communicator-rank order, and its collectives that rank's sequence on it.
 * Roots and peers are communicator ranks (group_src/group_dst). */
static int nccl_ops(struct st *s)
{
	struct job *j = s->j;
	int *members = NULL, rc = 0;
	for (size_t i = 0; i < j->nnccl && rc == 0; i++) {
		const struct a_nccl *c = &j->nccl[i];
		bool first = true;
		if (c->world != s->world || !c->init || c->rc || c->nranks < 1 || c->nranks > DPTP_MAX_WORLD ||
		    c->rank < 0 || s->r[c->rank].py)
			continue;
		for (size_t k = 0; k < i && first; k++)
			first = !(j->nccl[k].world == s->world && j->nccl[k].init && !strcmp(j->nccl[k].id, c->id));
		if (!first)
			continue;
		int *m = realloc(members, (size_t)c->nranks * sizeof(int));
		if (!m) {
			rc = -ENOMEM;
			break;
		}
		members = m;
		int have = 0;
		for (int k = 0; k < c->nranks; k++)
			members[k] = -1;
		for (size_t k = i; k < j->nnccl; k++) {
			const struct a_nccl *d = &j->nccl[k];
			if (d->world == s->world && d->init && !d->rc && !strcmp(d->id, c->id) && d->crank >= 0 &&
			    d->crank < c->nranks && members[d->crank] < 0 && d->rank >= 0 && !s->r[d->rank].py) {
				members[d->crank] = d->rank;
				have++;
			}
		}
		if (have != c->nranks)
			continue; /* members elsewhere (another node) or failed */
		int64_t *g64 = malloc((size_t)c->nranks * sizeof(*g64));
		if (!g64) {
			rc = -ENOMEM;
			break;
		}
		for (int k = 0; k < c->nranks; k++) {
			g64[k] = members[k];
			s->r[members[k]].nccl = true;
		}
		int gid = group_intern(j, s->world, g64, (size_t)c->nranks, 1000 + (int)i); /* never one of torch's */
		free(g64);
		if (gid < 0) {
			rc = gid;
			break;
		}
		j->g[gid].created = true;
		j->g[gid].nccl = true;
		for (size_t k = 0; k < j->ncnt; k++) /* the members' counts past their cap */
			if (j->cnt[k].gid < 0 && !strcmp(j->cnt[k].id, c->id) && in_list(members, (size_t)c->nranks,
			    proc_rank_in(&j->p[j->cnt[k].proc], s->world)))
				j->cnt[k].gid = gid;
		int *cnt = calloc((size_t)s->size, sizeof(int));
		if (!cnt) {
			rc = -ENOMEM;
			break;
		}
		char id[20];
		snprintf(id, sizeof(id), "%s", c->id);
		for (size_t k = 0; k < j->nnccl && rc == 0; k++) {
			const struct a_nccl d = j->nccl[k];
			if (d.world != s->world || d.init || strcmp(d.id, id) || d.rank < 0 || s->r[d.rank].py)
				continue;
			struct a_op x = {0}, *o = &x;
			o->lk = ++j->late_lk;
			o->proc = d.proc;
			o->world = s->world;
			o->rank = d.rank;
			o->gid = gid;
			o->t = d.t;
			o->site = d.site;
			o->n = d.n;
			o->done = true;
			char dt[16];
			snprintf(dt, sizeof(dt), "nccl%d", d.dt);
			o->op = str_intern(&j->str, d.op);
			o->dt = str_intern(&j->str, dt);
			if (!o->op || !o->dt) {
				rc = -ENOMEM;
				break;
			}
			o->pos = is_p2p(o->op) ? -1 : cnt[d.rank]++;
			if (o->pos >= 0) { /* its term, as the C recorder sums it past its cap */
				char sig[128];
				struct a_proc *p = &j->p[d.proc];
				if ((rc = proc_count(p, gid)) < 0)
					break;
				rc = 0;
				if (d.root >= 0)
					snprintf(sig, sizeof(sig), "%s|%lld|%s|root=%lld", d.op, (long long)d.n, dt, (long long)d.root);
				else
					snprintf(sig, sizeof(sig), "%s|%lld|%s|", d.op, (long long)d.n, dt);
				p->hsum[gid] += dptp_audit_term(sig_hash(sig), (uint64_t)p->cnt[gid]++);
			}
			o->seq = o->pos + 1;
			bool to = !strcmp(d.op, "send");
			int kk = to ? R_GDST : R_GSRC, kg = to ? R_DST : R_SRC;
			o->has[kk] = d.root >= 0;
			o->root[kk] = d.root;
			if (d.root >= 0 && d.root < c->nranks) { /* and as the global rank it is */
				o->has[kg] = true;
				o->root[kg] = members[d.root];
			}
			if ((rc = calls_add(j, o)) < 0)
				break;
			s->r[d.rank].last_op = proc_call(&j->p[d.proc], 0);
		}
		free(cnt);
	}
	free(members);
	return rc;
}

/* by the place of their first record in the files */
static int cmp_lk(const void *a, const void *b, void *arg)
{
	const struct a_group *g = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	if (g[x].lk != g[y].lk)
		return g[x].lk < g[y].lk ? -1 : 1;
	return (x > y) - (x < y);
}

/* this world's groups, in the order the files name them */
static int order_groups(struct st *s)
{
	const struct job *j = s->j;
	free(s->gorder);
	s->ngorder = 0;
	if (!(s->gorder = malloc((j->ng + 1) * sizeof(*s->gorder))))
		return -ENOMEM;
	for (size_t i = 0; i < j->ng; i++)
		if (j->g[i].world == s->world)
			s->gorder[s->ngorder++] = i;
	if (s->ngorder > 1)
		qsort_r(s->gorder, s->ngorder, sizeof(*s->gorder), cmp_lk, j->g);
	return 0;
}

int world_open(struct st *s, struct job *j, int world, struct audit_result *out)
{
	const struct a_world *w = &j->w[world];
	memset(s, 0, sizeof(*s));
	s->j = j;
	s->world = world;
	s->att = w->att;
	s->size = w->size;
	s->out = out;
	memset(out, 0, sizeof(*out));
	snprintf(out->world_id, sizeof(out->world_id), "%s", w->id);
	out->world = w->size;
	out->attempt = w->att;
	s->r = calloc((size_t)s->size, sizeof(*s->r));
	if (!s->r)
		return -ENOMEM;
	double hang_t = (size_t)s->att < j->nhang_t ? j->hang_t[s->att] : 0;
	for (int r = 0; r < s->size; r++) {
		s->r[r].proc = -1;
		s->r[r].dev = -1;
		s->r[r].local_rank = -1;
		s->r[r].last_op = NULL;
	}
	for (size_t i = 0; i < j->np; i++) {
		const struct a_proc *p = &j->p[i];
		int r = proc_rank_in(p, world);
		if (p->att != s->att || r < 0 || r >= s->size)
			continue;
		struct a_rank *rk = &s->r[r];
		if (p->py || p->c)
			rk->rec = true;
		rk->py |= p->py;
		rk->c |= p->c;
		/* an exit the hang watch caused is no exit of the program's */
		rk->exited |= p->ended || (p->wexit && !(hang_t > 0 && p->wexit_t >= hang_t));
		rk->raised |= p->raised;
		rk->capped |= p->capped; /* out->capped: where its calls past the cap are not compared (world_gaps) */
		if (p->sig && !(hang_t > 0 && p->wexit_t >= hang_t)) {
			rk->sig = p->sig;
			rk->core = p->core;
		}
		if (p->raised)
			snprintf(rk->exc, sizeof(rk->exc), "%s", p->exc);
		if (rk->proc < 0 || (p->py && !j->p[rk->proc].py)) {
			rk->proc = (int)i;
			rk->pid = p->pid;
			rk->local_rank = p->local_rank;
			snprintf(rk->host, sizeof(rk->host), "%s", p->host);
		}
		int dev = rank_device(p);
		if (dev >= 0) {
			rk->dev = dev;
			snprintf(rk->dev_site, sizeof(rk->dev_site), "%s", p->dev_site);
		}
		const struct a_op *last = proc_call(p, 0);
		if (last && last->world == world && (!rk->last_op || last->t >= rk->last_op->t))
			rk->last_op = last;
		out->nrecords += p->nrec;
	}
	for (int r = 0; r < s->size; r++) {
		out->nrecorded += s->r[r].rec;
		s->r[r].call_failed = s->r[r].last_op && s->r[r].last_op->err;
	}
	int rc = nccl_ops(s);
	return rc < 0 ? rc : order_groups(s);
}

void world_close(struct st *s)
{
	free(s->r);
	free(s->gorder);
	memset(s, 0, sizeof(*s));
}

/* ---- gaps: what was not recorded ---------------------------------------- */

static int proc_gaps(struct st *s, const struct a_proc *p, int rank, bool member)
{
	int rc = 0;
	if (p->c_says_py && !p->hello_py)
		rc = add_gap(s, rank, p->pid, "the Python recorder did not load in pid %d%s%s (python -I, -E or -S?)", (int)p->pid,
			p->exe[0] ? ", " : "", p->exe);
	else if (p->n_c_py_image > p->n_py_hello)
		rc = add_gap(s, rank, p->pid, "the Python recorder did not load in pid %d after an exec of %s", (int)p->pid,
			p->exe[0] ? p->exe : "another Python");
	if (rc == 0 && p->torn)
		rc = add_gap(s, rank, p->pid, "records of pid %d truncated (a torn last line: a full disk, or killed mid-write)",
			(int)p->pid);
	if (rc == 0 && p->bad > 0)
		rc = add_gap(s, rank, p->pid, "pid %d wrote %zu unreadable record%s (a torn line: a full disk or a short write)",
			(int)p->pid, p->bad, p->bad == 1 ? "" : "s");
	/* the records the cap dropped are no write failure */
	int64_t failed = p->lost - (p->dropped > 0 && p->dropped <= p->lost ? p->dropped : 0);
	if (rc == 0 && failed > 0)
		rc = add_gap(s, rank, p->pid, "pid %d lost %lld records (a full disk, an I/O error or a short write)", (int)p->pid,
			(long long)failed);
	if (rc == 0 && p->capped && !cap_compared(s, (int)(p - s->j->p))) {
		s->out->capped = true;
		rc = add_gap(s, rank, p->pid,
			"the record cap (%lld) was reached in pid %d: its calls past it are counted, not compared",
			(long long)p->cap_max, (int)p->pid);
	}
	if (rc == 0 && member && (p->py || p->c) && !p->ended && !p->wexit)
		rc = add_gap(s, rank, p->pid, "pid %d (rank %d) has no end record and the launcher did not see it exit", (int)p->pid,
			rank);
	return rc;
}

static int world_gaps(struct st *s)
{
	const struct job *j = s->j;
	int rc = 0;
	for (int r = 0; r < s->size && rc == 0; r++)
		if (!s->r[r].rec)
			rc = add_gap(s, r, 0, "rank %d of world %s has no records here (not recorded, or on another node)", r,
				s->out->world_id[0] ? s->out->world_id : "(the launcher's)");
	for (size_t i = 0; i < j->np && rc == 0; i++) {
		const struct a_proc *p = &j->p[i];
		if (p->att != s->att)
			continue;
		int own = proc_rank_in(p, s->world), o = p->owner;
		if (own >= 0) { /* a member: in its first world */
			if (!p->nw || p->w[0] == s->world)
				rc = proc_gaps(s, p, own, true);
		} else if (o >= 0 && o != (int)i && (j->p[o].nw ? j->p[o].w[0] : j->p[o].home_w) == s->world) {
			rc = proc_gaps(s, p, proc_rank_in(&j->p[o], s->world), false); /* a helper of a member */
		}
	}
	return rc;
}

static bool idle_world(const struct job *j, int w);

/* the world a process's gaps are reported in, -1: the job's */
static int gap_world(const struct job *j, const struct a_proc *p)
{
	if (p->owner < 0)
		return -1;
	const struct a_proc *o = &j->p[p->owner];
	int w = o->nw ? o->w[0] : o->home_w;
	return w < 0 || idle_world(j, w) ? -1 : w;
}

/* a launcher worker of which nothing of its tree recorded; processes no
 * reported world holds */
static int job_gaps(struct job *j, struct audit_report *rep)
{
	struct audit_result tmp = {0};
	struct st s = {.j = j, .out = &tmp};
	int rc = 0;
	for (size_t i = 0; i < j->np && rc == 0; i++) {
		const struct a_proc *p = &j->p[i];
		tmp.attempt = p->att;
		if (p->wstart && !p->py && !p->c) {
			bool child = false;
			for (size_t k = 0; k < j->np && !child; k++)
				child = j->p[k].att == p->att && j->p[k].ppid == p->pid && (j->p[k].py || j->p[k].c);
			if (!child)
				rc = add_gap(&s, p->wrank_l, p->pid, "no recorder loaded in rank %d (pid %d): a static binary?",
					p->wrank_l, (int)p->pid);
		} else if ((p->py || p->c) && gap_world(j, p) < 0) {
			rc = proc_gaps(&s, p, p->wstart ? p->wrank_l : p->worker ? p->env_rank : -1, false);
		}
	}
	rep->gaps = tmp.gaps;
	rep->ngaps = tmp.ngaps;
	return rc;
}

/* ---- the job ------------------------------------------------------------- */

static int cmp_finding(const void *a, const void *b)
{
	static const char order[] = "PRICGD";
	const struct audit_finding *x = a, *y = b;
	const char *px = strchr(order, x->mech), *py = strchr(order, y->mech);
	if (px != py)
		return px < py ? -1 : 1;
	int rx = x->nranks ? x->ranks[0] : -1, ry = y->nranks ? y->ranks[0] : -1;
	if (rx != ry)
		return (rx > ry) - (rx < ry);
	return strcmp(x->detail, y->detail);
}

/* A world with nothing to analyse beside another of its attempt: the
 * launcher's processes that only started the real workers (mp.spawn). */
static bool idle_world(const struct job *j, int w)
{
	if (j->w[w].id[0])
		return false;
	bool other = false;
	for (size_t k = 0; k < j->nw; k++)
		other |= (int)k != w && j->w[k].att == j->w[w].att;
	if (!other)
		return false;
	if (j->w[w].has_calls)
		return false;
	for (size_t i = 0; i < j->nres; i++)
		if (j->res[i].world == w)
			return false;
	for (size_t i = 0; i < j->ngpu; i++)
		if (j->gpu[i].world == w)
			return false;
	for (size_t i = 0; i < j->nnccl; i++)
		if (j->nccl[i].world == w)
			return false;
	return true;
}

static int analyze_world(struct job *j, int w, const struct dptp_layout *given, int hung_attempt,
			 struct audit_result *res)
{
	struct st s;
	struct name_use *u = NULL;
	size_t nu = 0;
	int rc = world_open(&s, j, w, res);
	if (rc == 0)
		rc = world_gaps(&s);
	if (rc == 0) {
		infer_layout(&s, given);
		rc = find_p(&s, hung_attempt == s.att);
	}
	if (rc == 0)
		rc = find_r(&s);
	if (rc == 0)
		rc = names_collect(&s, &u, &nu);
	if (rc == 0)
		rc = find_i(&s, u, nu);
	if (rc == 0)
		rc = find_c(&s, u, nu);
	if (rc == 0)
		rc = find_g(&s, u, nu);
	if (rc == 0)
		rc = find_d(&s);
	if (rc == 0 && res->nf > 1)
		qsort(res->f, res->nf, sizeof(*res->f), cmp_finding);
	names_release(u, nu);
	world_close(&s);
	return rc;
}

static int cmp_wlk(const void *a, const void *b, void *arg)
{
	const struct a_world *w = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	if (w[x].lk != w[y].lk)
		return w[x].lk < w[y].lk ? -1 : 1;
	return (x > y) - (x < y);
}

/* the worlds in the order the files name them first; NULL on ENOMEM */
static size_t *world_order(const struct job *j)
{
	size_t *v = malloc((j->nw + 1) * sizeof(*v));
	for (size_t i = 0; v && i < j->nw; i++)
		v[i] = i;
	if (v && j->nw > 1)
		qsort_r(v, j->nw, sizeof(*v), cmp_wlk, j->w);
	return v;
}

int audit_analyze_job(const char *dir, const struct dptp_layout *given, int hung_attempt, struct audit_report *rep,
		      struct dptp_err *err)
{
	struct job j;
	size_t capw = 0;
	memset(rep, 0, sizeof(*rep));
	int rc = job_load(&j, dir, err);
	if (rc < 0) {
		job_release(&j);
		return rc;
	}
	rep->nrecords = j.nrecords;
	rep->attempts = j.np || j.nw ? j.maxatt + 1 : 0;
	rep->calls = j.ncalls;
	rep->calls_held = j.held_peak;
	rc = job_gaps(&j, rep);
	size_t *order = rc == 0 ? world_order(&j) : NULL;
	if (rc == 0 && !order)
		rc = -ENOMEM;
	for (int att = 0; att <= j.maxatt && rc == 0; att++)
		for (size_t i = 0; i < j.nw && rc == 0; i++) {
			size_t w = order[i];
			if (j.w[w].att != att || idle_world(&j, (int)w))
				continue;
			struct audit_result *res = push(&rep->w, &rep->nw, &capw, sizeof(*rep->w));
			rc = res ? analyze_world(&j, (int)w, given, hung_attempt, res) : -ENOMEM;
		}
	free(order);
	if (rc == 0 && j.nexits) {
		rep->exits = j.exits;
		rep->nexits = j.nexits;
		j.exits = NULL;
	}
	job_release(&j);
	if (rc < 0)
		dptp_err_set(err, rc, "audit analysis: %s", strerror(-rc));
	return rc;
}

static void result_release(struct audit_result *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nf; i++) {
		free(r->f[i].ranks);
		free(r->f[i].replicas);
		free(r->f[i].site);
		free(r->f[i].group);
		free(r->f[i].detail);
		for (size_t t = 0; t < r->f[i].ntrail; t++)
			free(r->f[i].trail[t].c);
		free(r->f[i].trail);
	}
	free(r->f);
	free(r->gaps);
	memset(r, 0, sizeof(*r));
}

void audit_report_release(struct audit_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nw; i++)
		result_release(&r->w[i]);
	free(r->w);
	free(r->gaps);
	free(r->exits);
	memset(r, 0, sizeof(*r));
}

/* ---- the hang watch -------------------------------------------------------- */

/* Is pid still a process of this audit (its environment names the folder)?
 * A process that ended without an end record may have left its pid to
 * another program. */
static bool still_ours(pid_t pid, const char *dir)
{
	char path[64], buf[65536], want[4200];
	snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	int w = snprintf(want, sizeof(want), "DPTP_AUDIT_DIR=%s", dir);
	for (ssize_t i = 0; i + w <= n; i += (ssize_t)strnlen(buf + i, (size_t)(n - i)) + 1)
		if (!memcmp(buf + i, want, (size_t)w) && (i + w == n || buf[i + w] == '\0'))
			return true;
	return false;
}

int audit_analyze_pending(const char *dir, char *msg, size_t len, pid_t *pids, size_t *npids, size_t maxpids,
			  int *attempt)
{
	struct job j;
	int rc = job_load(&j, dir, NULL), found = 0, working = 0;
	size_t off = 0;
	*npids = 0;
	*attempt = j.maxatt;
	if (len)
		msg[0] = '\0';
	size_t *order = rc == 0 ? world_order(&j) : NULL;
	if (rc == 0 && !order)
		rc = -ENOMEM;
	for (size_t i = 0; i < j.nw && rc == 0 && !working; i++) {
		size_t w = order[i];
		if (j.w[w].att != j.maxatt || idle_world(&j, (int)w))
			continue;
		struct audit_result tmp;
		struct st s;
		rc = world_open(&s, &j, (int)w, &tmp);
		if (rc == 0)
			infer_layout(&s, NULL);
		int b = rc == 0 ? hang_blame(&s, false, msg + off, len > off ? len - off : 0) : 0;
		if (b < 0)
			rc = b;
		else if (b == 0)
			working = 1;
		else if (b == 1) {
			found = 1;
			off += strlen(msg + off);
			if (off + 2 < len) {
				msg[off++] = ';';
				msg[off++] = ' ';
				msg[off] = '\0';
			}
		}
		world_close(&s);
		result_release(&tmp);
	}
	free(order);
	if (off >= 2 && len > off && !strcmp(msg + off - 2, "; "))
		msg[off - 2] = '\0';
	/* the launcher's workers, and the processes they started still running */
	for (size_t i = 0; rc == 0 && i < j.np && *npids < maxpids; i++) {
		const struct a_proc *p = &j.p[i];
		if (p->att == j.maxatt && !p->ended && !p->wexit &&
		    (p->wstart || ((p->py || p->c) && still_ours(p->pid, dir))))
			pids[(*npids)++] = p->pid;
	}
	job_release(&j);
	if (rc < 0)
		return rc;
	return found && !working;
}
