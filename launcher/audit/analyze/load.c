/* dptp-run --audit: reading the audit folder into the job model (model.h).
 * Every file is read once, a buffer at a time; the Python files (the calls)
 * side by side, merged by time, so that the calls held (calls.c) are those
 * the ranks of a group are apart by: memory grows with the sockets, segments
 * and NCCL records kept, not with the collective calls. */
#include "audit/analyze/model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/audit_rec.h"

/* ---- strings ----------------------------------------------------------- */

static size_t hash_str(const char *s)
{
	size_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

const char *str_intern(struct a_strtab *t, const char *s)
{
	if (t->n * 2 >= t->nslot) {
		size_t ns = t->nslot ? t->nslot * 2 : 1024;
		size_t *slot = calloc(ns, sizeof(*slot));
		if (!slot)
			return NULL;
		for (size_t i = 0; i < t->n; i++) {
			size_t k = hash_str(t->v[i]) & (ns - 1);
			while (slot[k])
				k = (k + 1) & (ns - 1);
			slot[k] = i + 1;
		}
		free(t->slot);
		t->slot = slot;
		t->nslot = ns;
	}
	size_t k = hash_str(s) & (t->nslot - 1);
	while (t->slot[k]) {
		if (!strcmp(t->v[t->slot[k] - 1], s))
			return t->v[t->slot[k] - 1];
		k = (k + 1) & (t->nslot - 1);
	}
	if (grow((void **)&t->v, &t->cap, t->n + 1, sizeof(*t->v)) < 0)
		return NULL;
	char *c = strdup(s);
	if (!c)
		return NULL;
	t->v[t->n++] = c;
	t->slot[k] = t->n;
	return c;
}

static void strtab_release(struct a_strtab *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->v[i]);
	free(t->v);
	free(t->slot);
}

/* ---- processes and worlds ---------------------------------------------- */

static int proc_of(struct job *j, int att, pid_t pid)
{
	for (size_t i = j->np; i-- > 0;)
		if (j->p[i].att == att && j->p[i].pid == pid)
			return (int)i;
	struct a_proc *p = push(&j->p, &j->np, &j->capp, sizeof(*j->p));
	if (!p)
		return -ENOMEM;
	p->att = att;
	p->pid = pid;
	p->env_rank = p->env_world = p->local_rank = -1;
	p->cur_w = p->home_w = p->home_rank = -1;
	p->dev_set = p->dev_tensor = p->dev_nccl = p->dev_c = -1;
	p->wrank_l = -1;
	p->wlocal = -1;
	p->code = -1;
	p->owner = -1;
	return (int)j->np - 1;
}

/* The world (att, id, size); the launcher's ("") is one per attempt, as
 * large as its largest rank needs. */
static int world_of(struct job *j, int att, const char *id, int size)
{
	for (size_t i = 0; i < j->nw; i++) {
		if (j->w[i].att != att || strcmp(j->w[i].id, id))
			continue;
		if (!id[0] && size > j->w[i].size)
			j->w[i].size = size;
		if (!id[0] || j->w[i].size == size) {
			if (j->cur_lk < j->w[i].lk) /* the files are merged by time: the first in their order */
				j->w[i].lk = j->cur_lk;
			return (int)i;
		}
	}
	struct a_world *w = push(&j->w, &j->nw, &j->capw, sizeof(*j->w));
	if (!w)
		return -ENOMEM;
	w->lk = j->cur_lk;
	w->att = att;
	w->size = size;
	snprintf(w->id, sizeof(w->id), "%s", id);
	return (int)j->nw - 1;
}

static double rec_time(const struct dptp_audit_rec *rec)
{
	const struct dptp_audit_field *t = dptp_audit_rec_get(rec, "t");
	return t ? t->d : 0;
}

static bool rec_bool(const struct dptp_audit_rec *rec, const char *key)
{
	const struct dptp_audit_field *f = dptp_audit_rec_get(rec, key);
	return f && (f->type == DPTP_AV_BOOL || f->type == DPTP_AV_INT) && f->i;
}

/* The group a record names by g and gn in world w: its index, -1 when the
 * record has none, or -ENOMEM. */
static int rec_group(struct job *j, int w, const struct dptp_audit_rec *rec)
{
	const struct dptp_audit_field *g = dptp_audit_rec_get(rec, "g");
	if (!g || g->type != DPTP_AV_ARR || w < 0)
		return -1;
	return group_intern(j, w, g->a, g->n, (int)dptp_audit_rec_int(rec, "gn", 0));
}

/* the process's collectives so far on gid (its next position), the arrays
 * grown to hold gid; -ENOMEM */
int proc_count(struct a_proc *p, int gid)
{
	if ((size_t)gid >= p->ncnt) {
		size_t nc = (size_t)gid + 16;
		int *c = realloc(p->cnt, nc * sizeof(*c));
		if (c)
			p->cnt = c;
		uint64_t *h = c ? realloc(p->hsum, nc * sizeof(*h)) : NULL;
		if (!h)
			return -ENOMEM;
		p->hsum = h;
		memset(c + p->ncnt, 0, (nc - p->ncnt) * sizeof(*c));
		memset(h + p->ncnt, 0, (nc - p->ncnt) * sizeof(*h));
		p->ncnt = nc;
	}
	return p->cnt[gid];
}

/* its position among the process's collectives on gid; its term summed */
static int count_call(struct a_proc *p, int gid, const struct a_op *o)
{
	int pos = proc_count(p, gid);
	if (pos < 0)
		return pos;
	p->hsum[gid] += op_term(o->op, o->n, o->dt, o->has, o->root, pos);
	return p->cnt[gid]++;
}

static int on_op(struct job *j, int pi, const struct dptp_audit_rec *rec)
{
	struct a_proc *p = &j->p[pi];
	int gid = rec_group(j, p->cur_w, rec);
	if (gid < 0)
		return gid == -1 ? 0 : gid;
	struct a_op x = {0}, *o = &x;
	o->lk = j->cur_lk;
	o->proc = pi;
	o->world = p->cur_w;
	o->rank = p->wrank[p->nw - 1];
	o->gid = gid;
	o->t = rec_time(rec);
	o->seq = dptp_audit_rec_int(rec, "seq", 0);
	o->op = str_intern(&j->str, dptp_audit_rec_str(rec, "op", "?"));
	o->dt = str_intern(&j->str, dptp_audit_rec_str(rec, "dt", ""));
	if (!o->op || !o->dt)
		return -ENOMEM;
	o->n = dptp_audit_rec_int(rec, "n", -1);
	for (int k = 0; k < R_N; k++) {
		o->has[k] = dptp_audit_rec_has(rec, root_key[k]);
		o->root[k] = dptp_audit_rec_int(rec, root_key[k], -1);
	}
	if (!(o->site = str_intern(&j->str, dptp_audit_rec_str(rec, "site", "?"))))
		return -ENOMEM;
	o->pos = -1;
	if (!is_p2p(o->op) && (o->pos = count_call(p, gid, o)) < 0)
		return -ENOMEM;
	j->ncalls++;
	return calls_add(j, o);
}

/* a `done`: the call of this process with that group and seq returned */
static void on_done(struct job *j, int pi, const struct dptp_audit_rec *rec)
{
	struct a_proc *p = &j->p[pi];
	int gid = rec_group(j, p->cur_w, rec);
	long long seq = dptp_audit_rec_int(rec, "seq", 0);
	if (gid >= 0)
		calls_done(p, gid, seq, rec_bool(rec, "err"));
}

static void on_dev(struct a_proc *p, const struct dptp_audit_rec *rec)
{
	int dev = (int)dptp_audit_rec_int(rec, "dev", -1);
	const char *how = dptp_audit_rec_str(rec, "how", "");
	if (dev < 0)
		return;
	if (!strcmp(how, "set_device"))
		p->dev_set = dev;
	else if (!strcmp(how, "tensor") && p->dev_tensor < 0)
		p->dev_tensor = dev;
	else if (!strcmp(how, "cudaSetDevice"))
		p->dev_c = dev;
	else
		return;
	if (strcmp(how, "tensor") || !p->dev_site[0])
		snprintf(p->dev_site, sizeof(p->dev_site), "%s", dptp_audit_rec_str(rec, "site", ""));
}

/* the key joining a C record with the Python site record made before it */
static const char *join_key(struct job *j, const char *call, const char *key)
{
	char k[600];
	if (!strncmp(call, "cuda_", 5))
		call += 5;
	snprintf(k, sizeof(k), "%s\x1f%s", !strcmp(call, "open") ? "shm_open" : call, key);
	return str_intern(&j->str, k);
}

/* one more C record of process pi to join with a Python site by jkey */
static int count_join(struct job *j, int pi, const char *jkey)
{
	uintptr_t k[2] = {(uintptr_t)pi, (uintptr_t)jkey};
	size_t *n = kmap_get(&j->cjoin, k, true);
	if (!n)
		return -ENOMEM;
	++*n;
	return 0;
}

static int on_res(struct job *j, int pi, const struct dptp_audit_rec *rec, const char *kind, size_t ord)
{
	const char *call = dptp_audit_rec_str(rec, "call", "");
	char key[512];
	struct a_res x = {.proc = pi, .ord = ord, .rc = (int)dptp_audit_rec_int(rec, "rc", 0),
		.err = (int)dptp_audit_rec_int(rec, "err", 0), .t = rec_time(rec)};
	if (!strcmp(kind, "sock")) {
		if (!strcmp(dptp_audit_rec_str(rec, "by", ""), "nccl"))
			return 0; /* NCCL's own ports (its RAS port in every process) */
		x.unix_name = !strcmp(dptp_audit_rec_str(rec, "fam", ""), "unix");
		x.what = !strcmp(call, "bind") ? 'b' : !strcmp(call, "connect") ? 'c' : 0;
		if (!x.what)
			return 0;
		if (x.unix_name) {
			snprintf(key, sizeof(key), "%s", dptp_audit_rec_str(rec, "addr", ""));
			if (!key[0]) /* an unnamed (autobind) socket */
				return 0;
		} else {
			int64_t port = dptp_audit_rec_int(rec, "port", 0);
			if (port <= 0 || x.what != 'b') /* ephemeral ports, outgoing TCP */
				return 0;
			snprintf(key, sizeof(key), "port %lld", (long long)port);
		}
		x.port = !x.unix_name;
	} else {
		/* shm: shm_open names "/x"; opens under /dev/shm name the same segment */
		const char *name = dptp_audit_rec_str(rec, "name", "");
		int64_t fl = dptp_audit_rec_int(rec, "fl", 0);
		if (!strcmp(call, "shm_unlink"))
			return 0;
		if (!strncmp(name, "/dev/shm/", 9))
			name += 8;
		snprintf(key, sizeof(key), "%s%s", name[0] == '/' ? "" : "/", name);
		x.what = (fl & O_CREAT) ? 's' : 'o';
		x.excl = (fl & O_EXCL) != 0;
		call = "shm_open";
	}
	if (!(x.key = str_intern(&j->str, key)) || !(x.csite = str_intern(&j->str, dptp_audit_rec_str(rec, "site", ""))))
		return -ENOMEM;
	/* the site join key rides in .site until the join */
	if (!(x.site = join_key(j, call, key)))
		return -ENOMEM;
	if (x.what == 'c' && x.rc >= 0) {
		/* the same process connecting to the same name again (a connect
		 * per request): what the mechanisms see is its first success (a
		 * later failure keeps its place; its Python site may then be
		 * another connect's, unused: only the first use's site is shown) */
		uintptr_t k[3] = {(uintptr_t)pi, (uintptr_t)x.key, (uintptr_t)x.what};
		size_t *seen = kmap_get(&j->use_seen, k, true);
		if (!seen)
			return -ENOMEM;
		if ((*seen)++)
			return 0;
	}
	if (count_join(j, pi, x.site) < 0)
		return -ENOMEM;
	struct a_res *r = push(&j->res, &j->nres, &j->capres, sizeof(*j->res));
	if (!r)
		return -ENOMEM;
	*r = x;
	return 0;
}

static int on_gpu(struct job *j, int pi, const struct dptp_audit_rec *rec, size_t ord)
{
	const char *call = dptp_audit_rec_str(rec, "call", "");
	if (!strcmp(dptp_audit_rec_str(rec, "by", ""), "nccl"))
		return 0; /* NCCL's own buffers among its communicator's ranks */
	struct a_gpu *g = push(&j->gpu, &j->ngpu, &j->capgpu, sizeof(*j->gpu));
	if (!g)
		return -ENOMEM;
	g->proc = pi;
	g->ord = ord;
	g->exp = !strcmp(call, "ipc_get") || !strcmp(call, "vmm_export");
	snprintf(g->call, sizeof(g->call), "%s", call);
	g->dev = (int)dptp_audit_rec_int(rec, "dev", -1);
	g->rc = (int)dptp_audit_rec_int(rec, "rc", 0);
	g->t = rec_time(rec);
	g->h = str_intern(&j->str, dptp_audit_rec_str(rec, "h", ""));
	g->csite = str_intern(&j->str, dptp_audit_rec_str(rec, "site", ""));
	g->site = join_key(j, call, dptp_audit_rec_str(rec, "h", "")); /* the Python site's key is h too */
	return g->h && g->csite && g->site && count_join(j, pi, g->site) == 0 ? 0 : -ENOMEM;
}

static int on_nccl(struct job *j, int pi, const struct dptp_audit_rec *rec)
{
	struct a_proc *p = &j->p[pi];
	bool init = !strcmp(dptp_audit_rec_str(rec, "call", ""), "init");
	int dev = (int)dptp_audit_rec_int(rec, "dev", -1);
	if (init && dev >= 0)
		p->dev_nccl = dev;
	p->last_nccl_op = !init;
	struct a_nccl *x = push(&j->nccl, &j->nnccl, &j->capnccl, sizeof(*j->nccl));
	if (!x)
		return -ENOMEM;
	*x = (struct a_nccl){.proc = pi, .init = init, .nranks = (int)dptp_audit_rec_int(rec, "nranks", -1),
		.crank = (int)dptp_audit_rec_int(rec, "crank", -1), .n = dptp_audit_rec_int(rec, "n", -1),
		.root = dptp_audit_rec_int(rec, "root", -1), .dt = (int)dptp_audit_rec_int(rec, "dt", -1),
		.rc = (int)dptp_audit_rec_int(rec, "rc", 0), .t = rec_time(rec)};
	snprintf(x->id, sizeof(x->id), "%s", dptp_audit_rec_str(rec, "id", ""));
	snprintf(x->op, sizeof(x->op), "%s", dptp_audit_rec_str(rec, "op", ""));
	x->site = str_intern(&j->str, dptp_audit_rec_str(rec, "site", ""));
	return x->site ? 0 : -ENOMEM;
}

static void on_hello(struct a_proc *p, bool py, const struct dptp_audit_rec *rec)
{
	if (py) {
		p->hello_py = true;
		p->n_py_hello++;
		snprintf(p->flags, sizeof(p->flags), "%s", dptp_audit_rec_str(rec, "flags", ""));
		p->pre |= rec_bool(rec, "pre");
	} else {
		p->hello_c = true;
		p->c_says_py |= rec_bool(rec, "py");
		p->n_c_py_image += rec_bool(rec, "py");
		snprintf(p->exe, sizeof(p->exe), "%s", dptp_audit_rec_str(rec, "exe", ""));
	}
	if (dptp_audit_rec_has(rec, "ppid"))
		p->ppid = (pid_t)dptp_audit_rec_int(rec, "ppid", 0);
	p->worker |= rec_bool(rec, "worker");
	p->env_rank = (int)dptp_audit_rec_int(rec, "rank", -1);
	p->env_world = (int)dptp_audit_rec_int(rec, "world", -1);
	p->local_rank = (int)dptp_audit_rec_int(rec, "local_rank", -1);
	snprintf(p->host, sizeof(p->host), "%s", dptp_audit_rec_str(rec, "host", ""));
}

static int on_world(struct job *j, int pi, const struct dptp_audit_rec *rec)
{
	struct a_proc *p = &j->p[pi];
	int size = (int)dptp_audit_rec_int(rec, "size", -1), rank = (int)dptp_audit_rec_int(rec, "rank", -1);
	if (size < 1 || size > DPTP_MAX_WORLD || rank < 0 || rank >= size)
		return 0;
	int w = world_of(j, p->att, dptp_audit_rec_str(rec, "id", "?"), size);
	if (w < 0)
		return w;
	p->cur_w = w;
	if (p->nw && p->w[p->nw - 1] == w && p->wrank[p->nw - 1] == rank)
		return 0; /* init again in the same world */
	if (p->nw == A_MAXWORLDS)
		return 0;
	p->w[p->nw] = w;
	p->wrank[p->nw] = rank;
	p->wt[p->nw] = rec_time(rec);
	p->nw++;
	return 0;
}

static int on_record(struct job *j, int pi, bool py, const struct dptp_audit_rec *rec, size_t ord)
{
	struct a_proc *p = &j->p[pi];
	const char *k = dptp_audit_rec_str(rec, "k", "");
	j->nrecords++;
	p->nrec++;
	if (py && p->cur_w < 0 && !p->nw && p->worker && p->env_rank >= 0 && p->env_rank < DPTP_MAX_WORLD &&
	    (!strcmp(k, "group") || !strcmp(k, "op"))) {
		/* a worker's Python records without a world record (a recorder
		 * that writes none): the launcher's world, its rank from the
		 * environment */
		int w = world_of(j, p->att, "", p->env_world > p->env_rank ? p->env_world : p->env_rank + 1);
		if (w < 0)
			return w;
		p->cur_w = w;
		p->w[0] = w;
		p->wrank[0] = p->env_rank;
		p->wt[0] = 0;
		p->nw = 1;
	}
	switch (k[0]) {
	case 'h':
		if (!strcmp(k, "hello"))
			on_hello(p, py, rec);
		return 0;
	case 'w':
		return !strcmp(k, "world") && py ? on_world(j, pi, rec) : 0;
	case 'g':
		if (!strcmp(k, "group")) {
			int gid = rec_group(j, p->cur_w, rec);
			if (gid >= 0)
				j->g[gid].created = true;
			return gid == -1 ? 0 : gid < 0 ? gid : 0;
		}
		return !strcmp(k, "gpu") && !py ? on_gpu(j, pi, rec, ord) : 0;
	case 'o':
		return !strcmp(k, "op") && py && p->cur_w >= 0 ? on_op(j, pi, rec) : 0;
	case 'd':
		if (!strcmp(k, "done") && py)
			on_done(j, pi, rec);
		else if (!strcmp(k, "dev"))
			on_dev(p, rec);
		return 0;
	case 'e':
		if (!strcmp(k, "end") || !strcmp(k, "exit")) {
			p->ended = true;
			p->lost += dptp_audit_rec_int(rec, "lost", 0);
			p->dropped += dptp_audit_rec_int(rec, "dropped", 0);
		} else if (!strcmp(k, "exc")) {
			p->raised = true;
			snprintf(p->exc, sizeof(p->exc), "%s", dptp_audit_rec_str(rec, "msg", ""));
		}
		return 0;
	case 's':
		if (!strcmp(k, "sock") || !strcmp(k, "shm"))
			return py ? 0 : on_res(j, pi, rec, k, ord);
		if (!strcmp(k, "site")) {
			/* the k-th site joins the k-th C record (join_sites): the
			 * ones past the C records (read before) join none */
			const char *jkey = join_key(j, dptp_audit_rec_str(rec, "call", ""), dptp_audit_rec_str(rec, "key", ""));
			uintptr_t key[2] = {(uintptr_t)pi, (uintptr_t)jkey};
			size_t *nc = jkey ? kmap_get(&j->cjoin, key, false) : NULL, *np = jkey ? kmap_get(&j->pyjoin, key, true) : NULL;
			if (!np)
				return -ENOMEM;
			if (!nc || (*np)++ >= *nc)
				return 0;
			struct a_site *x = push(&j->sites, &j->nsites, &j->capsites, sizeof(*j->sites));
			if (!x)
				return -ENOMEM;
			x->proc = pi;
			x->ord = ord;
			x->jkey = jkey;
			x->site = str_intern(&j->str, dptp_audit_rec_str(rec, "site", ""));
			x->outer = str_intern(&j->str, dptp_audit_rec_str(rec, "outer", ""));
			return x->jkey && x->site && x->outer ? 0 : -ENOMEM;
		}
		return 0;
	case 'n':
		return !strcmp(k, "nccl") ? on_nccl(j, pi, rec) : 0;
	case 'c':
		if (!strcmp(k, "cap")) {
			p->capped = true;
			p->capped_c |= !py;
			p->capped_py |= py;
			p->cap_max = dptp_audit_rec_int(rec, "max", 0);
		} else if (!strcmp(k, "count")) {
			/* Python: per group; C: per NCCL communicator (id), its group
			 * made by the analysis (nccl_ops) */
			const char *id = py ? "" : dptp_audit_rec_str(rec, "id", "");
			int gid = py ? rec_group(j, p->cur_w, rec) : -1;
			if (gid < -1)
				return gid;
			struct a_count *c = gid >= 0 || id[0] ? push(&j->cnt, &j->ncnt, &j->capcnt, sizeof(*j->cnt)) : NULL;
			if ((gid >= 0 || id[0]) && !c)
				return -ENOMEM;
			if (c) {
				*c = (struct a_count){.proc = pi, .gid = gid, .seq = dptp_audit_rec_int(rec, "seq", 0),
					.nc = dptp_audit_rec_int(rec, "nc", -1)};
				snprintf(c->id, sizeof(c->id), "%s", id);
			}
			const char *hs = dptp_audit_rec_str(rec, "hs", "");
			if (c && strlen(hs) == 16 && strspn(hs, "0123456789abcdef") == 16) {
				c->hs = strtoull(hs, NULL, 16);
				c->has_hs = true;
			}
		}
		return 0;
	}
	return 0;
}

/* Calls fn on every complete line of path, a buffer at a time. *torn: the
 * file ends in a line without its newline. */
static int read_lines(const char *path, bool *torn, int (*fn)(void *, const char *, size_t, size_t), void *arg)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	size_t cap = 1 << 16, len = 0, ord = 0;
	char *buf = malloc(cap);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		if (len == cap) { /* a line longer than the buffer */
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t got = read(fd, buf + len, cap - len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = -errno;
			break;
		}
		if (got == 0)
			break;
		len += (size_t)got;
		size_t i = 0;
		for (char *nl; rc == 0 && (nl = memchr(buf + i, '\n', len - i));) {
			rc = fn(arg, buf + i, (size_t)(nl - (buf + i)), ord++);
			i = (size_t)(nl - buf) + 1;
		}
		memmove(buf, buf + i, len - i);
		len -= i;
		if (rc)
			break;
	}
	*torn = rc == 0 && len > 0;
	free(buf);
	close(fd);
	return rc;
}

struct line_ctx {
	struct job *j;
	int proc;
	bool py;
	int att;
};

static int proc_line(void *arg, const char *line, size_t len, size_t ord)
{
	struct line_ctx *c = arg;
	struct dptp_audit_rec rec;
	int rc = 0;
	if (dptp_audit_rec_parse(line, len, &rec) == 0)
		rc = on_record(c->j, c->proc, c->py, &rec, ord);
	else
		c->j->p[c->proc].bad++;
	dptp_audit_rec_release(&rec);
	return rc;
}

static int launcher_line(void *arg, const char *line, size_t len, size_t ord)
{
	struct line_ctx *c = arg;
	struct job *j = c->j;
	struct dptp_audit_rec rec;
	int rc = 0;
	(void)ord;
	if (dptp_audit_rec_parse(line, len, &rec) == 0) {
		const char *k = dptp_audit_rec_str(&rec, "k", "");
		int att = (int)dptp_audit_rec_int(&rec, "att", 0);
		pid_t pid = (pid_t)dptp_audit_rec_int(&rec, "pid", 0);
		int rank = (int)dptp_audit_rec_int(&rec, "rank", -1);
		bool start = !strcmp(k, "wstart"), exit = !strcmp(k, "wexit");
		if ((start || exit) && pid > 0 && att >= 0) {
			int pi = proc_of(j, att, pid);
			if (pi < 0)
				rc = pi;
			else if (start) {
				j->p[pi].wstart = true;
				j->p[pi].wrank_l = rank;
				/* the hellos' local rank first (job_load) */
				j->p[pi].wlocal = (int)dptp_audit_rec_int(&rec, "local_rank", -1);
			} else {
				struct a_proc *p = &j->p[pi];
				p->wexit = true;
				p->wrank_l = rank;
				p->code = (int)dptp_audit_rec_int(&rec, "code", -1);
				p->sig = (int)dptp_audit_rec_int(&rec, "sig", 0);
				p->core = rec_bool(&rec, "core");
				p->wexit_t = rec_time(&rec);
				struct audit_exit *e = push(&j->exits, &j->nexits, &j->capexits, sizeof(*j->exits));
				if (!e)
					rc = -ENOMEM;
				else
					*e = (struct audit_exit){.rank = rank, .pid = pid, .attempt = att, .code = p->code,
						.sig = p->sig, .core = p->core, .t = rec_time(&rec)};
			}
			if (att > j->maxatt)
				j->maxatt = att;
		} else if (!strcmp(k, "hang") && att >= 0 && att < 100000) {
			if ((size_t)att >= j->nhang_t) {
				double *h = realloc(j->hang_t, ((size_t)att + 1) * sizeof(*h));
				if (!h) {
					dptp_audit_rec_release(&rec);
					return -ENOMEM;
				}
				memset(h + j->nhang_t, 0, ((size_t)att + 1 - j->nhang_t) * sizeof(*h));
				j->hang_t = h;
				j->nhang_t = (size_t)att + 1;
			}
			if (!j->hang_t[att])
				j->hang_t[att] = rec_time(&rec);
		}
	}
	dptp_audit_rec_release(&rec);
	return rc;
}

/* the pid of a file's first record (its hello) */
static pid_t first_pid(const char *path)
{
	char line[4096];
	pid_t pid = 0;
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	if (fgets(line, sizeof(line), f)) {
		struct dptp_audit_rec rec;
		if (dptp_audit_rec_parse(line, strcspn(line, "\n"), &rec) == 0)
			pid = (pid_t)dptp_audit_rec_int(&rec, "pid", 0);
		dptp_audit_rec_release(&rec);
	}
	fclose(f);
	return pid;
}

/* a<att>.p<pid>.<py|c>.jsonl; until every recorder writes those, also the
 * first form r<rank>.a<att>.<py|c>.jsonl of the workers (pid: their hello's) */
static bool file_name(const char *dir, const char *name, int *att, pid_t *pid, bool *py, bool *legacy)
{
	char kind[4];
	int n = 0, p = 0, rank = 0;
	if (sscanf(name, "r%d.a%d.%3[a-z].jsonl%n", &rank, att, kind, &n) == 3 && !name[n] && rank >= 0 && *att >= 0) {
		char path[4200];
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		p = (int)first_pid(path);
		*legacy = true;
	} else if (sscanf(name, "a%d.p%d.%3[a-z].jsonl%n", att, &p, kind, &n) != 3 || name[n] || *att < 0) {
		return false;
	}
	if (p <= 0)
		return false;
	if (strcmp(kind, "py") && strcmp(kind, "c"))
		return false;
	*pid = (pid_t)p;
	*py = !strcmp(kind, "py");
	return true;
}

/* ---- after the load: worlds for processes without one, sites ----------- */

/* by (process, join key) only */
static int cmp_pk(const struct a_site *x, const struct a_site *y)
{
	if (x->proc != y->proc)
		return x->proc < y->proc ? -1 : 1;
	if (x->jkey != y->jkey)
		return (uintptr_t)x->jkey < (uintptr_t)y->jkey ? -1 : 1;
	return 0;
}

static int cmp_site(const void *a, const void *b)
{
	const struct a_site *x = a, *y = b;
	if (x->proc != y->proc)
		return x->proc < y->proc ? -1 : 1;
	if (x->jkey != y->jkey)
		return (uintptr_t)x->jkey < (uintptr_t)y->jkey ? -1 : 1;
	return (x->ord > y->ord) - (x->ord < y->ord);
}

struct jref {
	int proc;
	const char *jkey;
	size_t ord;
	const char **site; /* in: the join key; out: the site */
	const char *csite;
	const char **outer;
};

static int cmp_jref(const void *a, const void *b)
{
	const struct jref *x = a, *y = b;
	if (x->proc != y->proc)
		return x->proc < y->proc ? -1 : 1;
	if (x->jkey != y->jkey)
		return (uintptr_t)x->jkey < (uintptr_t)y->jkey ? -1 : 1;
	return (x->ord > y->ord) - (x->ord < y->ord);
}

/* The k-th C record of a process with a call + key gets the k-th Python
 * site record of that process with that call + key (the last when fewer),
 * else its own "lib+0xoff". O(n log n). */
static int join_sites(struct job *j)
{
	size_t n = j->nres + j->ngpu;
	struct jref *r = malloc((n ? n : 1) * sizeof(*r));
	if (!r)
		return -ENOMEM;
	for (size_t i = 0; i < j->nres; i++)
		r[i] = (struct jref){j->res[i].proc, j->res[i].site, j->res[i].ord, &j->res[i].site, j->res[i].csite,
			&j->res[i].outer};
	for (size_t i = 0; i < j->ngpu; i++)
		r[j->nres + i] = (struct jref){j->gpu[i].proc, j->gpu[i].site, j->gpu[i].ord, &j->gpu[i].site, j->gpu[i].csite,
			&j->gpu[i].outer};
	if (n > 1)
		qsort(r, n, sizeof(*r), cmp_jref);
	if (j->nsites > 1)
		qsort(j->sites, j->nsites, sizeof(*j->sites), cmp_site);
	size_t s = 0;
	for (size_t i = 0; i < n;) {
		size_t e = i;
		while (e < n && r[e].proc == r[i].proc && r[e].jkey == r[i].jkey)
			e++;
		struct a_site key = {.proc = r[i].proc, .jkey = r[i].jkey};
		while (s < j->nsites && cmp_pk(&j->sites[s], &key) < 0)
			s++;
		size_t se = s;
		while (se < j->nsites && j->sites[se].proc == key.proc && j->sites[se].jkey == key.jkey)
			se++;
		for (size_t k = i; k < e; k++) {
			const struct a_site *py = se > s ? &j->sites[s + (k - i < se - s ? k - i : se - s - 1)] : NULL;
			*r[k].site = py && py->site[0] ? py->site : r[k].csite;
			*r[k].outer = py && py->outer && py->site[0] ? py->outer : "";
		}
		i = e;
	}
	free(r);
	return 0;
}

static int cmp_proc(const void *a, const void *b, void *arg)
{
	const struct a_proc *p = arg, *x = &p[*(const int *)a], *y = &p[*(const int *)b];
	if (x->att != y->att)
		return x->att < y->att ? -1 : 1;
	return (x->pid > y->pid) - (x->pid < y->pid);
}

/* the index of process (att, pid) in by (sorted by cmp_proc), -1 none */
static int find_proc(const struct job *j, const int *by, int att, pid_t pid)
{
	size_t lo = 0, hi = j->np;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const struct a_proc *p = &j->p[by[mid]];
		if (p->att < att || (p->att == att && p->pid < pid))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < j->np && j->p[by[lo]].att == att && j->p[by[lo]].pid == pid ? by[lo] : -1;
}

/* the process whose world a helper process's records belong to: itself or
 * its nearest ancestor with one */
static int owner_of(const struct job *j, const int *by, int pi)
{
	for (int hop = 0; pi >= 0 && hop < 64; hop++) {
		const struct a_proc *p = &j->p[pi];
		if (p->nw || p->home_w >= 0)
			return pi;
		pi = p->ppid > 0 ? find_proc(j, by, p->att, p->ppid) : -1;
	}
	return -1;
}

static void resolve(const struct job *j, int owner, double t, int *w, int *rank)
{
	*w = *rank = -1;
	if (owner < 0)
		return;
	const struct a_proc *p = &j->p[owner];
	if (!p->nw) {
		*w = p->home_w;
		*rank = p->home_rank;
		return;
	}
	int k = 0;
	for (int i = 1; i < p->nw; i++)
		if (p->wt[i] <= t)
			k = i;
	*w = p->w[k];
	*rank = p->wrank[k];
}

/* Workers and NCCL programs without a world record: the attempt's world ""
 * (ranks from wstart or the environment); helpers: their ancestor's. */
static int place(struct job *j)
{
	bool *nccl = calloc(j->np + 1, sizeof(*nccl));
	int *owner = malloc((j->np + 1) * sizeof(*owner));
	if (!nccl || !owner) {
		free(nccl);
		free(owner);
		return -ENOMEM;
	}
	for (size_t i = 0; i < j->nnccl; i++)
		nccl[j->nccl[i].proc] = true;
	for (int att = 0; att <= j->maxatt; att++) {
		int size = 0;
		for (size_t i = 0; i < j->np; i++) {
			struct a_proc *p = &j->p[i];
			int rank = p->wstart ? p->wrank_l : p->env_rank;
			if (p->att != att || p->nw || !(p->wstart || p->worker || (nccl[i] && rank >= 0)) || rank < 0 ||
			    rank >= DPTP_MAX_WORLD)
				continue;
			p->home_rank = rank;
			if (rank + 1 > size)
				size = rank + 1;
			if (p->env_world > size && p->env_world <= DPTP_MAX_WORLD)
				size = p->env_world;
		}
		if (!size)
			continue;
		int w = world_of(j, att, "", size);
		if (w < 0) {
			free(nccl);
			free(owner);
			return w;
		}
		for (size_t i = 0; i < j->np; i++)
			if (j->p[i].att == att && !j->p[i].nw && j->p[i].home_rank >= 0)
				j->p[i].home_w = w;
	}
	for (size_t i = 0; i < j->np; i++)
		owner[i] = (int)i;
	if (j->np > 1)
		qsort_r(owner, j->np, sizeof(*owner), cmp_proc, j->p);
	int *by = owner;
	if (!(owner = malloc((j->np + 1) * sizeof(*owner)))) {
		free(nccl);
		free(by);
		return -ENOMEM;
	}
	for (size_t i = 0; i < j->np; i++)
		j->p[i].owner = owner[i] = owner_of(j, by, (int)i);
	free(by);
	for (size_t i = 0; i < j->nres; i++)
		resolve(j, owner[j->res[i].proc], j->res[i].t, &j->res[i].world, &j->res[i].rank);
	for (size_t i = 0; i < j->ngpu; i++)
		resolve(j, owner[j->gpu[i].proc], j->gpu[i].t, &j->gpu[i].world, &j->gpu[i].rank);
	for (size_t i = 0; i < j->nnccl; i++)
		resolve(j, j->p[j->nccl[i].proc].nw || j->p[j->nccl[i].proc].home_w >= 0 ? (int)j->nccl[i].proc : -1,
			j->nccl[i].t, &j->nccl[i].world, &j->nccl[i].rank);
	free(nccl);
	free(owner);
	return 0;
}

/* A failed create (EADDRINUSE, EEXIST) the process recovered from: its
 * next create of the same kind (after other failures: the loop goes on)
 * succeeded, from the same site when both are known (the free-port loop). */
static int mark_recovered(struct job *j)
{
	const char **next = calloc(j->np * 3 + 1, sizeof(*next)); /* the next success's site, NULL none */
	if (!next)
		return -ENOMEM;
	for (size_t i = j->nres; i-- > 0;) {
		struct a_res *x = &j->res[i];
		size_t k = (size_t)x->proc * 3 + (x->port ? 0 : x->unix_name ? 1 : 2);
		if (x->what != 'b' && x->what != 's')
			continue;
		if (x->rc >= 0)
			next[k] = x->site;
		else
			x->recovered = next[k] && (next[k] == x->site || !next[k][0] || !x->site[0]);
	}
	free(next);
	return 0;
}

/* ---- the Python files, merged by time ------------------------------------ */

/* A Python file read a buffer at a time, its next record parsed: the files
 * are read side by side, the record with the earliest time first, so that
 * each group's window holds only the calls its ranks are apart by. */
struct reader {
	char *path;
	int fd;            /* -1: opened again at off when needed (many files) */
	off_t off;
	char *buf;
	size_t cap, len, pos;
	size_t ord;        /* the next line's number in the file */
	int proc;
	bool eof, have;
	double t;          /* the record's time, else the last one's */
	uint64_t lk;
	struct dptp_audit_rec rec;
};

enum { READERS_OPEN = 200, READER_BUF = 1 << 14 };

static int reader_fill(struct reader *r, bool keep_open)
{
	if (r->pos) {
		memmove(r->buf, r->buf + r->pos, r->len - r->pos);
		r->len -= r->pos;
		r->pos = 0;
	}
	if (r->len == r->cap) { /* a line longer than the buffer */
		char *nb = realloc(r->buf, r->cap * 2);
		if (!nb)
			return -ENOMEM;
		r->buf = nb;
		r->cap *= 2;
	}
	if (r->fd < 0 && (r->fd = open(r->path, O_RDONLY | O_CLOEXEC)) < 0)
		return errno == ENOENT ? (r->eof = true, 0) : -errno;
	ssize_t got;
	do
		got = pread(r->fd, r->buf + r->len, r->cap - r->len, r->off);
	while (got < 0 && errno == EINTR);
	if (got < 0)
		return -errno;
	if (got == 0)
		r->eof = true;
	r->len += (size_t)got;
	r->off += got;
	if (!keep_open || r->eof) {
		close(r->fd);
		r->fd = -1;
	}
	return 0;
}

/* the next record of r (r->have), skipping the lines that are none */
static int reader_next(struct job *j, struct reader *r, bool keep_open)
{
	if (r->have)
		dptp_audit_rec_release(&r->rec);
	r->have = false;
	for (;;) {
		char *nl = r->len > r->pos ? memchr(r->buf + r->pos, '\n', r->len - r->pos) : NULL;
		if (!nl) {
			if (r->eof)
				return 0;
			int rc = reader_fill(r, keep_open);
			if (rc < 0)
				return rc;
			continue;
		}
		size_t n = (size_t)(nl - (r->buf + r->pos));
		r->lk = ((uint64_t)r->proc << 32) | (uint64_t)(r->ord & 0xffffffffu);
		r->ord++;
		int rc = dptp_audit_rec_parse(r->buf + r->pos, n, &r->rec);
		r->pos += n + 1;
		if (rc == 0) {
			const struct dptp_audit_field *t = dptp_audit_rec_get(&r->rec, "t");
			if (t && t->d > r->t)
				r->t = t->d;
			r->have = true;
			return 0;
		}
		dptp_audit_rec_release(&r->rec);
		if (rc == -ENOMEM)
			return rc;
		j->p[r->proc].bad++;
	}
}

/* earliest first; the same time: the files' order */
static bool reader_before(const struct reader *a, const struct reader *b)
{
	return a->t < b->t || (a->t == b->t && a->lk < b->lk);
}

static void heap_down(struct reader **h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		if (l < n && reader_before(h[l], h[m]))
			m = l;
		if (l + 1 < n && reader_before(h[l + 1], h[m]))
			m = l + 1;
		if (m == i)
			return;
		struct reader *x = h[i];
		h[i] = h[m];
		h[m] = x;
		i = m;
	}
}

static int merge_py(struct job *j, struct reader *rd, size_t n)
{
	struct reader **h = malloc((n + 1) * sizeof(*h));
	size_t nh = 0;
	bool keep_open = n <= READERS_OPEN;
	int rc = h ? 0 : -ENOMEM;
	for (size_t i = 0; i < n && rc == 0; i++) {
		rd[i].fd = -1;
		if (!(rd[i].buf = malloc(READER_BUF)))
			rc = -ENOMEM;
		rd[i].cap = READER_BUF;
		if (rc == 0)
			rc = reader_next(j, &rd[i], keep_open);
		if (rc == 0 && rd[i].have)
			h[nh++] = &rd[i];
	}
	for (size_t i = nh / 2; i-- > 0;)
		heap_down(h, nh, i);
	while (rc == 0 && nh) {
		struct reader *r = h[0];
		j->cur_lk = r->lk;
		rc = on_record(j, r->proc, true, &r->rec, r->ord - 1);
		if (rc == 0)
			rc = reader_next(j, r, keep_open);
		if (rc == 0 && !r->have)
			h[0] = h[--nh];
		heap_down(h, nh, 0);
	}
	for (size_t i = 0; i < n; i++) {
		/* a file that ends in a line without its newline */
		j->p[rd[i].proc].torn |= rc == 0 && rd[i].len > rd[i].pos;
		if (rd[i].have)
			dptp_audit_rec_release(&rd[i].rec);
		if (rd[i].fd >= 0)
			close(rd[i].fd);
		free(rd[i].buf);
		free(rd[i].path);
	}
	free(h);
	return rc;
}

int job_load(struct job *j, const char *dir, struct dptp_err *err)
{
	struct dirent **ents = NULL;
	struct reader *rd = NULL;
	size_t nrd = 0, caprd = 0;
	int rc = 0;
	memset(j, 0, sizeof(*j));
	calls_init(j);
	/* in name order: the same folder gives the same report */
	int nents = scandir(dir, &ents, NULL, alphasort);
	if (nents < 0)
		return dptp_err_set(err, -errno, "cannot read the audit folder '%s': %s", dir, strerror(errno));
	/* the C files and the launcher's first, each whole; the Python ones
	 * (the calls) then side by side */
	for (int i = 0; i < nents && rc == 0; i++) {
		const char *name = ents[i]->d_name;
		int att;
		pid_t pid;
		bool py, torn = false, legacy = false;
		char path[4200];
		struct line_ctx c = {.j = j};
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		j->cur_lk = (uint64_t)j->np << 32;
		if (!strcmp(name, "launcher.jsonl")) {
			j->have_launcher = true;
			rc = read_lines(path, &torn, launcher_line, &c);
			continue;
		}
		if (!file_name(dir, name, &att, &pid, &py, &legacy))
			continue;
		if ((c.proc = proc_of(j, att, pid)) < 0) {
			rc = c.proc;
			break;
		}
		c.py = py;
		if (att > j->maxatt)
			j->maxatt = att;
		if (py)
			j->p[c.proc].py = true;
		else
			j->p[c.proc].c = true;
		j->p[c.proc].worker |= legacy; /* the first form: workers only */
		if (py) {
			struct reader *r = push(&rd, &nrd, &caprd, sizeof(*rd));
			if (!r || !(r->path = strdup(path))) {
				rc = -ENOMEM;
				break;
			}
			r->proc = c.proc;
			continue;
		}
		j->p[c.proc].cur_w = -1;
		rc = read_lines(path, &torn, proc_line, &c);
		j->p[c.proc].torn |= torn;
	}
	for (size_t i = 0; i < nrd; i++)
		j->p[rd[i].proc].cur_w = -1;
	if (rc == 0)
		rc = merge_py(j, rd, nrd);
	else
		for (size_t i = 0; i < nrd; i++)
			free(rd[i].path);
	free(rd);
	for (int i = 0; i < nents; i++)
		free(ents[i]);
	free(ents);
	for (size_t i = 0; i < j->np; i++)
		if (j->p[i].local_rank < 0)
			j->p[i].local_rank = j->p[i].wlocal;
	j->cur_lk = j->late_lk = (uint64_t)1 << 62;
	if (rc == 0)
		rc = place(j);
	if (rc == 0)
		rc = join_sites(j);
	if (rc == 0)
		rc = mark_recovered(j);
	if (rc < 0)
		return dptp_err_set(err, rc, "cannot read the audit records in '%s': %s", dir, strerror(-rc));
	return 0;
}

void job_release(struct job *j)
{
	calls_release(j);
	for (size_t i = 0; i < j->np; i++) {
		free(j->p[i].cnt);
		free(j->p[i].hsum);
	}
	free(j->p);
	free(j->w);
	for (size_t i = 0; i < j->ng; i++)
		free(j->g[i].ranks);
	free(j->g);
	free(j->gslot);
	free(j->res);
	free(j->gpu);
	free(j->nccl);
	free(j->sites);
	free(j->cnt);
	free(j->exits);
	free(j->jgaps);
	free(j->hang_t);
	strtab_release(&j->str);
	memset(j, 0, sizeof(*j));
}
