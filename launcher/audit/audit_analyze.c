/* dptp-run --audit: the analysis (see audit_analyze.h). */
#include "audit/audit_analyze.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/audit_rec.h"

enum { R_SRC, R_DST, R_GSRC, R_GDST, R_N };
static const char *const root_key[R_N] = {"src", "dst", "gsrc", "gdst"};

struct a_group {
	int *ranks;
	size_t n;
	int gn;
	bool created; /* a group record named it (not only a call) */
};

struct a_op {
	int rank, gid;
	int pos;     /* index among this rank's collectives on gid; -1: point-to-point */
	char op[32];
	char dt[16];
	int64_t n;
	int64_t root[R_N];
	bool has[R_N];
	double t;
	char *site;
};

/* a socket or shared-memory event of the C recorder */
struct a_res {
	int rank;
	char what;   /* 'b' bound, 'c' connected, 's' segment created, 'o' opened */
	bool excl;
	bool unix_name; /* an AF_UNIX name (else a port or a segment) */
	bool port;
	char *key;   /* "@abstract", "/path", "port 5557", "/segment" */
	const char *site; /* the Python caller's, from a site record; "" */
	int rc, err;
	double t;
};

/* an NCCL record of the C recorder */
struct a_nccl {
	int rank;
	bool init;
	char id[20];  /* the communicator, by its unique id's hash */
	int nranks, crank, dt, rc;
	char op[32];
	int64_t n, root; /* root: a rank of the communicator, -1 none */
	double t;
};

struct a_rank {
	bool py, c, exited, raised;
	bool nccl;   /* no Python records: its sequences are NCCL's */
	int local_rank;
	pid_t pid;
	char host[64];
	char exc[160];
	int dev_set, dev_tensor, dev_nccl, dev_c; /* -1 none */
	char dev_site[256];
	long last_op; /* index of its last call in st.op, -1 none */
	int *cnt;    /* collectives so far per group */
	size_t ncnt;
};

struct st {
	int att, world, nranks;
	struct a_rank *r;
	struct a_group *g;
	size_t ng, capg;
	struct a_op *op;
	size_t nop, capop;
	struct a_res *res;
	size_t nres, capres;
	struct a_res *sites; /* site records: rank, key, site (in what) */
	size_t nsites, capsites;
	struct a_nccl *nccl;
	size_t nnccl, capnccl;
	size_t nrecords;
	struct audit_result *out;
	size_t capf;
};

static int grow(void **p, size_t *cap, size_t want, size_t sz)
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
static void *push(void *pv, size_t *n, size_t *cap, size_t sz)
{
	void **p = pv;
	if (grow(p, cap, *n + 1, sz) < 0)
		return NULL;
	char *e = (char *)*p + *n * sz;
	memset(e, 0, sz);
	(*n)++;
	return e;
}

static bool is_p2p(const char *op)
{
	static const char *const p2p[] = {"send", "recv", "isend", "irecv", "send_object_list", "recv_object_list"};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(p2p); i++)
		if (!strcmp(op, p2p[i]))
			return true;
	return false;
}

/* the input's size must agree on every member */
static bool sized(const char *op)
{
	static const char *const v[] = {"broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
		"_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "gather", "scatter",
		"broadcast_object_list", "all_reduce_coalesced", "all_gather_coalesced"};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(v); i++)
		if (!strcmp(op, v[i]))
			return true;
	return false;
}

static bool in_list(const int *v, size_t n, int64_t x)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

static int group_id(struct st *s, const struct dptp_audit_field *g, int gn)
{
	for (size_t i = 0; i < s->ng; i++) {
		if (s->g[i].n != g->n || s->g[i].gn != gn)
			continue;
		size_t k = 0;
		while (k < g->n && s->g[i].ranks[k] == g->a[k])
			k++;
		if (k == g->n)
			return (int)i;
	}
	struct a_group *ng = push(&s->g, &s->ng, &s->capg, sizeof(*s->g));
	if (!ng || !(ng->ranks = malloc((g->n ? g->n : 1) * sizeof(int))))
		return -ENOMEM;
	for (size_t k = 0; k < g->n; k++)
		ng->ranks[k] = (int)g->a[k];
	ng->n = g->n;
	ng->gn = gn;
	return (int)s->ng - 1;
}

static int add_res(struct st *s, int rank, char what, const char *key, int rc, int errn, double t)
{
	struct a_res *x = push(&s->res, &s->nres, &s->capres, sizeof(*s->res));
	if (!x)
		return -ENOMEM;
	*x = (struct a_res){.rank = rank, .what = what, .rc = rc, .err = errn, .t = t, .key = strdup(key)};
	return x->key ? 0 : -ENOMEM;
}

/* The group a record names by g and gn: its index, -1 when the record has
 * none, or -ENOMEM. */
static int rec_group(struct st *s, const struct dptp_audit_rec *rec)
{
	const struct dptp_audit_field *g = dptp_audit_rec_get(rec, "g");
	if (!g || g->type != DPTP_AV_ARR)
		return -1;
	return group_id(s, g, (int)dptp_audit_rec_int(rec, "gn", 0));
}

/* A new call of rank on group gid: numbered among the rank's collectives
 * on that group. NULL when out of memory. */
static struct a_op *new_op(struct st *s, int rank, int gid, const char *op, const char *site, double t)
{
	struct a_rank *rk = &s->r[rank];
	struct a_op *o = push(&s->op, &s->nop, &s->capop, sizeof(*s->op));
	if (!o)
		return NULL;
	o->rank = rank;
	o->gid = gid;
	o->t = t;
	o->pos = -1;
	snprintf(o->op, sizeof(o->op), "%s", op);
	if (!(o->site = strdup(site)))
		return NULL;
	rk->last_op = (long)s->nop - 1;
	if (!is_p2p(o->op)) {
		if ((size_t)gid >= rk->ncnt) {
			size_t nc = (size_t)gid + 16;
			int *c = realloc(rk->cnt, nc * sizeof(*c));
			if (!c)
				return NULL;
			memset(c + rk->ncnt, 0, (nc - rk->ncnt) * sizeof(*c));
			rk->cnt = c;
			rk->ncnt = nc;
		}
		o->pos = rk->cnt[gid]++;
	}
	return o;
}

static double rec_time(const struct dptp_audit_rec *rec)
{
	const struct dptp_audit_field *t = dptp_audit_rec_get(rec, "t");
	return t ? t->d : 0;
}

static int on_op(struct st *s, int rank, const struct dptp_audit_rec *rec)
{
	int gid = rec_group(s, rec);
	if (gid < 0)
		return gid == -1 ? 0 : gid;
	struct a_op *o = new_op(s, rank, gid, dptp_audit_rec_str(rec, "op", "?"), dptp_audit_rec_str(rec, "site", "?"),
		rec_time(rec));
	if (!o)
		return -ENOMEM;
	snprintf(o->dt, sizeof(o->dt), "%s", dptp_audit_rec_str(rec, "dt", ""));
	o->n = dptp_audit_rec_int(rec, "n", -1);
	for (int k = 0; k < R_N; k++) {
		o->has[k] = dptp_audit_rec_has(rec, root_key[k]);
		o->root[k] = dptp_audit_rec_int(rec, root_key[k], -1);
	}
	return 0;
}

static void on_dev(struct a_rank *rk, const struct dptp_audit_rec *rec)
{
	int dev = (int)dptp_audit_rec_int(rec, "dev", -1);
	const char *how = dptp_audit_rec_str(rec, "how", "");
	if (dev < 0)
		return;
	if (!strcmp(how, "set_device"))
		rk->dev_set = dev;
	else if (!strcmp(how, "tensor") && rk->dev_tensor < 0)
		rk->dev_tensor = dev;
	else if (!strcmp(how, "cudaSetDevice"))
		rk->dev_c = dev;
	else
		return;
	if (strcmp(how, "tensor") || !rk->dev_site[0])
		snprintf(rk->dev_site, sizeof(rk->dev_site), "%s", dptp_audit_rec_str(rec, "site", ""));
}

static int on_res(struct st *s, int rank, const struct dptp_audit_rec *rec, const char *kind)
{
	const char *call = dptp_audit_rec_str(rec, "call", "");
	int rc = (int)dptp_audit_rec_int(rec, "rc", 0), e = (int)dptp_audit_rec_int(rec, "err", 0);
	const struct dptp_audit_field *tf = dptp_audit_rec_get(rec, "t");
	double t = tf ? tf->d : 0;
	char key[512];
	if (!strcmp(kind, "sock")) {
		const char *fam = dptp_audit_rec_str(rec, "fam", "");
		if (!strcmp(dptp_audit_rec_str(rec, "by", ""), "nccl"))
			return 0; /* NCCL's own ports (its RAS port in every process) */
		bool unix_name = !strcmp(fam, "unix");
		char what = !strcmp(call, "bind") ? 'b' : !strcmp(call, "connect") ? 'c' : 0;
		if (!what)
			return 0;
		if (unix_name) {
			snprintf(key, sizeof(key), "%s", dptp_audit_rec_str(rec, "addr", ""));
			if (!key[0]) /* an unnamed (autobind) socket */
				return 0;
		} else {
			int64_t port = dptp_audit_rec_int(rec, "port", 0);
			if (port <= 0 || what != 'b') /* ephemeral ports, outgoing TCP */
				return 0;
			snprintf(key, sizeof(key), "port %lld", (long long)port);
		}
		int r = add_res(s, rank, what, key, rc, e, t);
		if (r == 0) {
			s->res[s->nres - 1].unix_name = unix_name;
			s->res[s->nres - 1].port = !unix_name;
		}
		return r;
	}
	/* shm: shm_open names "/x"; opens under /dev/shm name the same segment */
	const char *name = dptp_audit_rec_str(rec, "name", "");
	int64_t fl = dptp_audit_rec_int(rec, "fl", 0);
	if (!strcmp(call, "shm_unlink"))
		return 0;
	if (!strncmp(name, "/dev/shm/", 9))
		name += 8;
	snprintf(key, sizeof(key), "%s%s", name[0] == '/' ? "" : "/", name);
	int r = add_res(s, rank, (fl & O_CREAT) ? 's' : 'o', key, rc, e, t);
	if (r == 0)
		s->res[s->nres - 1].excl = (fl & O_EXCL) != 0;
	return r;
}

static int on_record(struct st *s, int rank, bool py, const struct dptp_audit_rec *rec)
{
	struct a_rank *rk = &s->r[rank];
	const char *k = dptp_audit_rec_str(rec, "k", "");
	s->nrecords++;
	if (!strcmp(k, "hello")) {
		int w = (int)dptp_audit_rec_int(rec, "world", -1);
		if (w > s->world)
			s->world = w;
		rk->local_rank = (int)dptp_audit_rec_int(rec, "local_rank", -1);
		if (py || !rk->pid)
			rk->pid = (pid_t)dptp_audit_rec_int(rec, "pid", 0);
		snprintf(rk->host, sizeof(rk->host), "%s", dptp_audit_rec_str(rec, "host", ""));
		return 0;
	}
	if (!strcmp(k, "group")) {
		int gid = rec_group(s, rec);
		if (gid >= 0)
			s->g[gid].created = true;
		return gid == -1 ? 0 : gid < 0 ? gid : 0;
	}
	if (!strcmp(k, "op"))
		return py ? on_op(s, rank, rec) : 0;
	if (!strcmp(k, "dev")) {
		on_dev(rk, rec);
		return 0;
	}
	if (!strcmp(k, "exit")) {
		rk->exited = true;
		return 0;
	}
	if (!strcmp(k, "exc")) {
		rk->raised = true;
		snprintf(rk->exc, sizeof(rk->exc), "%s", dptp_audit_rec_str(rec, "msg", ""));
		return 0;
	}
	if (!strcmp(k, "sock") || !strcmp(k, "shm"))
		return on_res(s, rank, rec, k);
	if (!strcmp(k, "site")) {
		struct a_res *x = push(&s->sites, &s->nsites, &s->capsites, sizeof(*s->sites));
		if (!x)
			return -ENOMEM;
		x->rank = rank;
		x->key = strdup(dptp_audit_rec_str(rec, "key", ""));
		x->site = strdup(dptp_audit_rec_str(rec, "site", ""));
		return x->key && x->site ? 0 : -ENOMEM;
	}
	if (!strcmp(k, "nccl")) {
		bool init = !strcmp(dptp_audit_rec_str(rec, "call", ""), "init");
		int dev = (int)dptp_audit_rec_int(rec, "dev", -1);
		if (init && dev >= 0)
			rk->dev_nccl = dev;
		struct a_nccl *x = push(&s->nccl, &s->nnccl, &s->capnccl, sizeof(*s->nccl));
		if (!x)
			return -ENOMEM;
		*x = (struct a_nccl){.rank = rank, .init = init, .nranks = (int)dptp_audit_rec_int(rec, "nranks", -1),
			.crank = (int)dptp_audit_rec_int(rec, "crank", -1), .n = dptp_audit_rec_int(rec, "n", -1),
			.root = dptp_audit_rec_int(rec, "root", -1), .dt = (int)dptp_audit_rec_int(rec, "dt", -1),
			.rc = (int)dptp_audit_rec_int(rec, "rc", 0), .t = rec_time(rec)};
		snprintf(x->id, sizeof(x->id), "%s", dptp_audit_rec_str(rec, "id", ""));
		snprintf(x->op, sizeof(x->op), "%s", dptp_audit_rec_str(rec, "op", ""));
	}
	return 0;
}

static int load_file(struct st *s, const char *path, int rank, bool py)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf) {
			close(fd);
			return -ENOMEM;
		}
		if (len == cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb)
				free(buf);
			buf = nb;
			cap *= 2;
			continue;
		}
		ssize_t got = read(fd, buf + len, cap - len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break;
		len += (size_t)got;
	}
	close(fd);
	if (py)
		s->r[rank].py = true;
	else
		s->r[rank].c = true;
	for (size_t i = 0; i < len && rc == 0;) {
		char *nl = memchr(buf + i, '\n', len - i);
		if (!nl) /* a torn last record */
			break;
		struct dptp_audit_rec rec;
		if (dptp_audit_rec_parse(buf + i, (size_t)(nl - (buf + i)), &rec) == 0)
			rc = on_record(s, rank, py, &rec);
		dptp_audit_rec_release(&rec);
		i = (size_t)(nl - buf) + 1;
	}
	free(buf);
	return rc;
}

static bool file_name(const char *name, int *rank, int *att, bool *py)
{
	char kind[4];
	int n = 0;
	if (sscanf(name, "r%d.a%d.%3[a-z].jsonl%n", rank, att, kind, &n) != 3 || name[n] || *rank < 0 ||
	    *rank >= DPTP_MAX_WORLD || *att < 0)
		return false;
	if (strcmp(kind, "py") && strcmp(kind, "c"))
		return false;
	*py = !strcmp(kind, "py");
	return true;
}

static void state_release(struct st *s)
{
	for (int i = 0; i < s->nranks; i++)
		free(s->r[i].cnt);
	free(s->r);
	for (size_t i = 0; i < s->ng; i++)
		free(s->g[i].ranks);
	free(s->g);
	for (size_t i = 0; i < s->nop; i++)
		free(s->op[i].site);
	free(s->op);
	for (size_t i = 0; i < s->nres; i++)
		free(s->res[i].key);
	free(s->res);
	for (size_t i = 0; i < s->nsites; i++) {
		free(s->sites[i].key);
		free((char *)s->sites[i].site);
	}
	free(s->sites);
	free(s->nccl);
}

/* A program whose ranks make no Python records (C++ over NCCL): each
 * communicator whose members all recorded its creation is a group, in
 * communicator-rank order, and its collectives that rank's sequence on it.
 * Roots and peers are communicator ranks (group_src/group_dst). */
static int nccl_ops(struct st *s)
{
	int *members = NULL;
	int rc = 0;
	for (size_t i = 0; i < s->nnccl && rc == 0; i++) {
		const struct a_nccl *c = &s->nccl[i];
		bool first = true;
		if (!c->init || c->rc || c->nranks < 1 || c->nranks > DPTP_MAX_WORLD || s->r[c->rank].py)
			continue;
		for (size_t j = 0; j < i && first; j++)
			first = !(s->nccl[j].init && !strcmp(s->nccl[j].id, c->id));
		if (!first)
			continue;
		int *m = realloc(members, (size_t)c->nranks * sizeof(int));
		if (!m)
			return -ENOMEM;
		members = m;
		int have = 0;
		for (int k = 0; k < c->nranks; k++)
			members[k] = -1;
		for (size_t j = i; j < s->nnccl; j++) {
			const struct a_nccl *d = &s->nccl[j];
			if (d->init && !d->rc && !strcmp(d->id, c->id) && d->crank >= 0 && d->crank < c->nranks &&
			    members[d->crank] < 0 && !s->r[d->rank].py) {
				members[d->crank] = d->rank;
				have++;
			}
		}
		if (have != c->nranks)
			continue; /* members elsewhere (another node) or failed */
		int64_t g64[DPTP_MAX_WORLD];
		for (int k = 0; k < c->nranks; k++) {
			g64[k] = members[k];
			s->r[members[k]].nccl = true;
		}
		struct dptp_audit_field g = {.type = DPTP_AV_ARR, .a = g64, .n = (size_t)c->nranks};
		int gid = group_id(s, &g, 1000 + (int)i); /* never one of torch's */
		if (gid < 0)
			return gid;
		s->g[gid].created = true;
		for (size_t j = 0; j < s->nnccl && rc == 0; j++) {
			const struct a_nccl *d = &s->nccl[j];
			if (d->init || strcmp(d->id, c->id) || s->r[d->rank].py)
				continue;
			struct a_op *o = new_op(s, d->rank, gid, d->op, "", d->t);
			if (!o) {
				rc = -ENOMEM;
				break;
			}
			o->n = d->n;
			snprintf(o->dt, sizeof(o->dt), "nccl%d", d->dt);
			bool to = !strcmp(d->op, "send");
			int k = to ? R_GDST : R_GSRC, kg = to ? R_DST : R_SRC;
			o->has[k] = d->root >= 0;
			o->root[k] = d->root;
			if (d->root >= 0 && d->root < c->nranks) { /* and as the global rank it is */
				o->has[kg] = true;
				o->root[kg] = members[d->root];
			}
		}
	}
	free(members);
	return rc;
}

static int load(struct st *s, const char *dir, struct dptp_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int maxrank = -1, rc = 0;
	if (!d)
		return dptp_err_set(err, -errno, "cannot read the audit folder '%s': %s", dir, strerror(errno));
	s->att = -1;
	while ((e = readdir(d))) {
		int rank, att;
		bool py;
		if (!file_name(e->d_name, &rank, &att, &py))
			continue;
		if (att > s->att)
			s->att = att;
	}
	rewinddir(d);
	while ((e = readdir(d))) {
		int rank, att;
		bool py;
		if (file_name(e->d_name, &rank, &att, &py) && att == s->att && rank > maxrank)
			maxrank = rank;
	}
	s->nranks = maxrank + 1;
	s->r = calloc(s->nranks > 0 ? (size_t)s->nranks : 1, sizeof(*s->r));
	if (!s->r) {
		closedir(d);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	for (int i = 0; i < s->nranks; i++) {
		s->r[i].dev_set = s->r[i].dev_tensor = s->r[i].dev_nccl = s->r[i].dev_c = -1;
		s->r[i].local_rank = -1;
		s->r[i].last_op = -1;
	}
	rewinddir(d);
	while (rc == 0 && (e = readdir(d))) {
		int rank, att;
		bool py;
		char path[4200];
		if (!file_name(e->d_name, &rank, &att, &py) || att != s->att)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		rc = load_file(s, path, rank, py);
	}
	closedir(d);
	if (rc < 0)
		return dptp_err_set(err, rc, "cannot read the audit records in '%s': %s", dir, strerror(-rc));
	for (size_t i = 0; i < s->nres; i++) {
		s->res[i].site = "";
		for (size_t j = 0; j < s->nsites; j++)
			if (s->sites[j].rank == s->res[i].rank && !strcmp(s->sites[j].key, s->res[i].key)) {
				s->res[i].site = s->sites[j].site;
				break;
			}
	}
	if (s->world < s->nranks)
		s->world = s->nranks;
	return nccl_ops(s) < 0 ? dptp_err_set(err, -ENOMEM, "out of memory") : 0;
}

/* ---- the layout ---------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

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

static void infer_layout(struct st *s, struct audit_result *res)
{
	int w = s->world, *tmp = malloc(((size_t)w + 1) * sizeof(int)), *sorted = malloc(((size_t)w + 1) * sizeof(int));
	size_t nsub = 0;
	bool found = false;
	struct dptp_layout best = {0};
	if (!tmp || !sorted)
		goto out;
	for (size_t i = 0; i < s->ng; i++)
		if (s->g[i].n > 1 && (int)s->g[i].n < w)
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
			for (size_t i = 0; i < s->ng && ok; i++) {
				const struct a_group *g = &s->g[i];
				bool bad = false;
				if (g->n <= 1 || (int)g->n >= w)
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

/* ---- findings ------------------------------------------------------ */

static int replica_of(const struct audit_result *res, int rank)
{
	if (!res->layout_known || rank < 0 || rank >= res->layout.world)
		return -1;
	return dptp_layout_coord(&res->layout, rank).dp;
}

static void fmt_ranks(char *buf, size_t len, const int *v, size_t n)
{
	size_t off = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "," : "", v[i]);
}

__attribute__((format(printf, 7, 8)))
static int add_finding(struct st *s, char mech, const int *ranks, size_t nranks, const char *site, const char *op,
		       const char *fmt, ...)
{
	struct audit_result *res = s->out;
	/* released with the result whatever happens next */
	struct audit_finding *f = push(&res->f, &res->nf, &s->capf, sizeof(*res->f));
	if (!f)
		return -ENOMEM;
	f->mech = mech;
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

static int set_group(struct audit_finding *f, const int *ranks, size_t n)
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

static void describe_op(char *buf, size_t len, const struct a_op *o)
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

static bool same_call(const struct a_op *a, const struct a_op *b)
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

/* the collectives of each rank on one group, in order */
struct seqs {
	const struct a_op ***v; /* v[member index][pos] */
	size_t *len;
	size_t n;
};

static int build_seqs(const struct st *s, int gid, struct seqs *q)
{
	const struct a_group *g = &s->g[gid];
	q->n = g->n;
	q->v = calloc(g->n, sizeof(*q->v));
	q->len = calloc(g->n, sizeof(*q->len));
	if (!q->v || !q->len)
		return -ENOMEM;
	for (size_t m = 0; m < g->n; m++) {
		int r = g->ranks[m];
		if (r < 0 || r >= s->nranks || !(s->r[r].py || s->r[r].nccl))
			continue;
		size_t cnt = (size_t)gid < s->r[r].ncnt ? (size_t)s->r[r].cnt[gid] : 0;
		q->v[m] = calloc(cnt ? cnt : 1, sizeof(**q->v));
		if (!q->v[m])
			return -ENOMEM;
		q->len[m] = cnt;
	}
	for (size_t i = 0; i < s->nop; i++) {
		const struct a_op *o = &s->op[i];
		if (o->gid != gid || o->pos < 0)
			continue;
		for (size_t m = 0; m < g->n; m++)
			if (g->ranks[m] == o->rank && q->v[m] && (size_t)o->pos < q->len[m])
				q->v[m][o->pos] = o;
	}
	return 0;
}

static void free_seqs(struct seqs *q)
{
	for (size_t m = 0; q->v && m < q->n; m++)
		free(q->v[m]);
	free(q->v);
	free(q->len);
}

/* A missing collective: `short_ranks` never entered the one `waiting`
 * entered first at time t. */
struct missing {
	int gid;
	const struct a_op *first; /* the earliest entry by a peer */
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

/* P: disagreements; missing collectives are collected into *miss (those of
 * ranks that raised are not: the exception is the story). */
static int find_p(struct st *s, bool all_missing, struct missing **miss, size_t *nmiss)
{
	size_t capm = 0;
	int rc = 0;
	*miss = NULL;
	*nmiss = 0;
	for (size_t gid = 0; gid < s->ng && rc == 0; gid++) {
		const struct a_group *g = &s->g[gid];
		struct seqs q = {0};
		size_t nrec = 0, maxlen = 0, ref = 0;
		if ((rc = build_seqs(s, (int)gid, &q)) < 0) {
			free_seqs(&q);
			break;
		}
		for (size_t m = 0; m < g->n; m++)
			if (q.v[m]) {
				nrec++;
				if (q.len[m] > maxlen) {
					maxlen = q.len[m];
					ref = m;
				}
			}
		if (nrec < 2 || !maxlen) {
			free_seqs(&q);
			continue;
		}
		size_t minlen = maxlen;
		for (size_t m = 0; m < g->n; m++)
			if (q.v[m] && q.len[m] < minlen)
				minlen = q.len[m];
		bool diverged = false;
		for (size_t k = 0; k < minlen && !diverged; k++) {
			/* the largest class of identical calls is the reference */
			size_t best = ref, bestn = 0;
			for (size_t a = 0; a < g->n; a++) {
				size_t c = 0;
				if (!q.v[a] || !q.v[a][k])
					continue;
				for (size_t b = 0; b < g->n; b++)
					c += q.v[b] && q.v[b][k] && same_call(q.v[a][k], q.v[b][k]);
				if (c > bestn) {
					bestn = c;
					best = a;
				}
			}
			const struct a_op *r0 = q.v[best][k];
			int dev[DPTP_MAX_WORLD];
			size_t ndev = 0, nat = 0;
			const struct a_op *d0 = NULL;
			for (size_t m = 0; m < g->n; m++)
				if (q.v[m] && q.v[m][k]) {
					nat++;
					if (!same_call(q.v[m][k], r0)) {
						dev[ndev++] = g->ranks[m];
						if (!d0)
							d0 = q.v[m][k];
					}
				}
			if (!ndev)
				continue;
			if (bestn * 2 <= nat) /* no majority: every member is suspect */
				for (size_t m = 0; m < g->n; m++)
					if (q.v[m] && q.v[m][k] && same_call(q.v[m][k], r0))
						dev[ndev++] = g->ranks[m];
			diverged = true;
			char a[160], b[160], gr[256];
			describe_op(a, sizeof(a), d0);
			describe_op(b, sizeof(b), r0);
			fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
			rc = add_finding(s, 'P', dev, ndev, d0->site, d0->op,
				"collective #%zu on group [%s]: rank %d called %s at %s while rank %d called %s at %s",
				k + 1, gr, d0->rank, a, d0->site, r0->rank, b, r0->site);
			if (rc == 0)
				rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
		}
		if (!diverged && minlen < maxlen && rc == 0) {
			/* who stopped short, at the first call they never entered */
			for (size_t k = minlen; k < maxlen && rc == 0; k++) {
				struct missing mm = {.gid = (int)gid};
				mm.short_ranks = malloc(g->n * sizeof(int));
				mm.waiting = malloc(g->n * sizeof(int));
				if (!mm.short_ranks || !mm.waiting) {
					free(mm.short_ranks);
					free(mm.waiting);
					rc = -ENOMEM;
					break;
				}
				for (size_t m = 0; m < g->n; m++) {
					int r = g->ranks[m];
					if (!q.v[m])
						continue;
					if (q.len[m] > k) {
						mm.waiting[mm.nwaiting++] = r;
						if (!mm.first || q.v[m][k]->t < mm.first->t)
							mm.first = q.v[m][k];
					} else if (q.len[m] == k && !s->r[r].raised && (all_missing || s->r[r].exited)) {
						mm.short_ranks[mm.nshort++] = r;
					}
				}
				if (!mm.nshort || !mm.first ||
				    grow((void **)miss, &capm, *nmiss + 1, sizeof(**miss)) < 0) {
					free(mm.short_ranks);
					free(mm.waiting);
					continue;
				}
				(*miss)[(*nmiss)++] = mm;
			}
		}
		free_seqs(&q);
	}
	return rc;
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

/* Has rank r simply not reached the call at `site` yet? It is blocked
 * (alive, its last call still open) at an earlier line of the same file. */
static bool behind(const struct st *s, int r, const char *site)
{
	const struct a_rank *rk = &s->r[r];
	size_t fa, fb;
	long la, lb;
	if (rk->exited || rk->last_op < 0)
		return false;
	const char *at = s->op[rk->last_op].site;
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
		bool waits = behind(st, r, m[i].first->site);
		for (size_t j = 0; j < n && !waits; j++) {
			size_t fa, fb;
			long la, lb;
			bool same_file = split_site(m[j].first->site, &fa, &la) && split_site(m[i].first->site, &fb, &lb) &&
					 fa == fb && !strncmp(m[j].first->site, m[i].first->site, fa);
			if (j != i && !same_file && m[j].first->t < m[i].first->t && in_list(m[j].waiting, m[j].nwaiting, r))
				waits = true;
		}
		if (!waits)
			return false;
	}
	return true;
}

static int report_missing(struct st *s, const struct missing *m, size_t n, const char *why)
{
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (consequence(s, m, n, i))
			continue;
		const struct a_group *g = &s->g[m[i].gid];
		char a[160], gr[256], sr[256], wr[256];
		describe_op(a, sizeof(a), m[i].first);
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		fmt_ranks(sr, sizeof(sr), m[i].short_ranks, m[i].nshort);
		fmt_ranks(wr, sizeof(wr), m[i].waiting, m[i].nwaiting);
		rc = add_finding(s, 'P', m[i].short_ranks, m[i].nshort, m[i].first->site, m[i].first->op,
			"rank%s %s never entered %s at %s on group [%s], which rank%s %s entered%s",
			m[i].nshort > 1 ? "s" : "", sr, a, m[i].first->site, gr, m[i].nwaiting > 1 ? "s" : "", wr, why);
		if (rc == 0)
			rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
	}
	return rc;
}

/* R: a root outside the call's group; the same numeric peer on every
 * replica. One finding per (site, op). */
static int find_r(struct st *s)
{
	int rc = 0;
	bool *done = calloc(s->nop ? s->nop : 1, sizeof(*done));
	int *ranks = malloc(((size_t)s->nranks + 1) * sizeof(int));
	if (!done || !ranks) {
		free(done);
		free(ranks);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nop && rc == 0; i++) {
		const struct a_op *o = &s->op[i];
		const struct a_group *g = &s->g[o->gid];
		int bad_k = -1;
		if (done[i])
			continue;
		for (int k = 0; k < R_N && bad_k < 0; k++) {
			if (!o->has[k])
				continue;
			bool global = k == R_SRC || k == R_DST;
			if (global ? !in_list(g->ranks, g->n, o->root[k]) : (o->root[k] < 0 || (size_t)o->root[k] >= g->n))
				bad_k = k;
		}
		if (bad_k < 0)
			continue;
		size_t nr = 0;
		for (size_t j = i; j < s->nop; j++) {
			const struct a_op *p = &s->op[j];
			if (done[j] || strcmp(p->site, o->site) || strcmp(p->op, o->op) || !p->has[bad_k])
				continue;
			const struct a_group *pg = &s->g[p->gid];
			bool global = bad_k == R_SRC || bad_k == R_DST;
			if (global ? in_list(pg->ranks, pg->n, p->root[bad_k]) : (size_t)p->root[bad_k] < pg->n)
				continue;
			done[j] = true;
			if (!in_list(ranks, nr, p->rank))
				ranks[nr++] = p->rank;
		}
		char gr[256], lucky[160] = "";
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		/* the same number right elsewhere: by coincidence */
		for (size_t j = 0; j < s->nop && !lucky[0] && (bad_k == R_SRC || bad_k == R_DST); j++) {
			const struct a_op *p = &s->op[j];
			const struct a_group *pg = &s->g[p->gid];
			if (p->gid != o->gid && p->has[bad_k] && p->root[bad_k] == o->root[bad_k] && !strcmp(p->site, o->site) &&
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
	/* the silent twin: point-to-point calls of one site whose peers, the
	 * same numbers on every replica, all lie in one replica */
	const struct audit_result *res = s->out;
	if (res->layout_known && res->layout.dp > 1) {
		memset(done, 0, s->nop * sizeof(*done));
		for (size_t i = 0; i < s->nop && rc == 0; i++) {
			const struct a_op *o = &s->op[i];
			int k = o->has[R_DST] ? R_DST : o->has[R_SRC] ? R_SRC : -1;
			if (done[i] || o->pos >= 0 || k < 0)
				continue;
			/* replicas calling from this site, and where their peers are */
			int callers = 0, peer_rep = -2, ncall_reps = 0;
			bool one_peer_rep = true;
			int seen[64] = {0};
			size_t nr = 0;
			for (size_t j = i; j < s->nop; j++) {
				const struct a_op *p = &s->op[j];
				if (done[j] || p->pos >= 0 || strcmp(p->site, o->site) || strcmp(p->op, o->op) || !p->has[k])
					continue;
				done[j] = true;
				const struct a_group *pg = &s->g[p->gid];
				int peer = (int)p->root[k];
				if (!in_list(pg->ranks, pg->n, peer))
					continue; /* reported above */
				int dr = replica_of(res, p->rank), dp = replica_of(res, peer);
				if (dr < 0 || dp < 0)
					continue;
				if (peer_rep == -2)
					peer_rep = dp;
				one_peer_rep &= dp == peer_rep;
				if (dr < 64 && !seen[dr]) {
					seen[dr] = 1;
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
	}
	free(done);
	free(ranks);
	return rc;
}

/* G (a): a loop that broadcasts one slice per DP replica over a group
 * spanning replicas: each round's sources must come one from each replica. */
static int find_g_loop(struct st *s)
{
	const struct audit_result *res = s->out;
	int rc = 0, dp = res->layout_known ? res->layout.dp : 0;
	if (dp < 2)
		return 0;
	for (size_t gid = 0; gid < s->ng && rc == 0; gid++) {
		const struct a_group *g = &s->g[gid];
		bool spans = false;
		for (size_t m = 1; m < g->n; m++)
			spans |= replica_of(res, g->ranks[m]) != replica_of(res, g->ranks[0]);
		if (!spans)
			continue;
		struct seqs q = {0};
		size_t ref = SIZE_MAX;
		if ((rc = build_seqs(s, (int)gid, &q)) < 0) {
			free_seqs(&q);
			break;
		}
		for (size_t m = 0; m < g->n; m++)
			if (q.v[m] && (ref == SIZE_MAX || q.len[m] > q.len[ref]))
				ref = m;
		if (ref == SIZE_MAX) {
			free_seqs(&q);
			continue;
		}
		/* per site: the broadcasts in order, cut into rounds of dp */
		bool *used = calloc(q.len[ref] + 1, sizeof(*used));
		const struct a_op **run = calloc((size_t)q.len[ref] + 1, sizeof(*run));
		for (size_t k = 0; used && run && k < q.len[ref] && rc == 0; k++) {
			const struct a_op *o = q.v[ref][k];
			if (used[k] || !o || strcmp(o->op, "broadcast") || !o->has[R_SRC])
				continue;
			size_t nrun = 0;
			for (size_t j = k; j < q.len[ref]; j++) {
				const struct a_op *p = q.v[ref][j];
				if (p && !strcmp(p->op, o->op) && !strcmp(p->site, o->site) && p->has[R_SRC]) {
					used[j] = true;
					run[nrun++] = p;
				}
			}
			if (nrun % (size_t)dp)
				continue;
			for (size_t r0 = 0; r0 < nrun && rc == 0; r0 += (size_t)dp) {
				int have[DPTP_MAX_WORLD] = {0}, srcs[DPTP_MAX_WORLD];
				bool distinct = true, covers = true;
				for (int i = 0; i < dp; i++) {
					srcs[i] = (int)run[r0 + (size_t)i]->root[R_SRC];
					for (int j = 0; j < i; j++)
						distinct &= srcs[j] != srcs[i];
					int d = replica_of(res, srcs[i]);
					if (d >= 0)
						have[d]++;
				}
				for (int d = 0; d < dp; d++)
					covers &= have[d] == 1;
				if (!distinct || covers)
					continue;
				int victims[DPTP_MAX_WORLD];
				size_t nv = 0;
				for (size_t m = 0; m < g->n; m++) {
					int d = replica_of(res, g->ranks[m]);
					if (d >= 0 && !have[d])
						victims[nv++] = g->ranks[m];
				}
				char gr[256], sr[256];
				fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
				fmt_ranks(sr, sizeof(sr), srcs, (size_t)dp);
				rc = add_finding(s, 'G', victims, nv, o->site, o->op,
					"a loop of %d broadcasts over group [%s], which spans replicas, takes its sources from ranks %s: not one per replica, so the slices of the replicas with none are another replica's data (the dispatch broadcast on the EP group instead of the DP group)",
					dp, gr, sr);
				if (rc == 0)
					rc = set_group(&s->out->f[s->out->nf - 1], g->ranks, g->n);
				break; /* one finding per site */
			}
		}
		free(used);
		free(run);
		free_seqs(&q);
	}
	return rc;
}

/* I, C, G (b): names, ports and segments. */
static int find_names(struct st *s)
{
	const struct audit_result *res = s->out;
	int rc = 0;
	bool *done = calloc(s->nres ? s->nres : 1, sizeof(*done));
	int *owners = malloc(((size_t)s->nranks + 1) * sizeof(int)), *users = malloc(((size_t)s->nranks + 1) * sizeof(int));
	if (!done || !owners || !users) {
		free(done);
		free(owners);
		free(users);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nres && rc == 0; i++) {
		if (done[i])
			continue;
		const struct a_res *x = &s->res[i];
		size_t no = 0, nu = 0, ncoll = 0, nok = 0;
		bool excl = false;
		const char *site = "", *usite = "";
		int coll_err = 0;
		for (size_t j = i; j < s->nres; j++) {
			const struct a_res *y = &s->res[j];
			if (done[j] || strcmp(y->key, x->key) || y->port != x->port)
				continue;
			done[j] = true;
			bool creates = y->what == 'b' || y->what == 's';
			if (creates && !site[0])
				site = y->site;
			if (!creates && !usite[0])
				usite = y->site;
			if (creates && y->rc >= 0) {
				nok++;
				if (!in_list(owners, no, y->rank))
					owners[no++] = y->rank;
				excl |= y->excl;
			} else if (creates && (y->err == EADDRINUSE || y->err == EEXIST)) {
				ncoll++;
				coll_err = y->err;
				if (!in_list(owners, no, y->rank))
					owners[no++] = y->rank;
			} else if (!creates && y->rc >= 0 && !in_list(users, nu, y->rank)) {
				users[nu++] = y->rank;
			}
		}
		int reps = 0, rep0 = -2;
		for (size_t k = 0; k < no; k++) {
			int d = replica_of(res, owners[k]);
			if (k == 0)
				rep0 = d;
			else if (d != rep0)
				reps = 1;
		}
		/* a segment every member opens with O_CREAT is shared, not
		 * taken: only replicas meeting on it, or EEXIST, tell */
		bool segment = !x->unix_name && !x->port;
		bool collide = no > 1 && (!segment || reps || ncoll);
		if (collide) {
			char o[256];
			qsort(owners, no, sizeof(int), cmp_int);
			fmt_ranks(o, sizeof(o), owners, no);
			const char *how = ncoll ? (coll_err == EADDRINUSE ? "the later ones failed with EADDRINUSE (\"[Errno 98] Address already in use\")"
								: "the later ones failed with EEXIST (\"[Errno 17] File exists\")")
						: (segment && !excl ? "they opened one segment between them" : "every one succeeded, serialised in time: a reordering makes it fail");
			const char *what = x->port ? "port" : segment ? "shared-memory segment" : "socket name";
			char mech = x->port && reps ? 'C' : 'I';
			rc = add_finding(s, mech, owners, no, site, x->port ? "bind" : segment ? "shm_open" : "bind",
				"%s%s%s%s taken by ranks %s%s: %s; %s", what, x->port ? "" : " '", x->port ? x->key + 4 : x->key,
				x->port ? "" : "'", o,
				reps ? " of different replicas" : "", how,
				mech == 'C' ? "a port offset by a coordinate they share (a DP rank forced to 0)"
					    : "a name that should be unique lacks the group, replica or instance part (or comes from an identically seeded RNG)");
			continue;
		}
		/* one owner, users in other replicas: G */
		if (no == 1 && nu) {
			int d0 = replica_of(res, owners[0]);
			int cross[DPTP_MAX_WORLD];
			size_t nc = 0;
			for (size_t k = 0; k < nu; k++) {
				int d = replica_of(res, users[k]);
				if (d >= 0 && d0 >= 0 && d != d0)
					cross[nc++] = users[k];
			}
			if (nc) {
				char u[256];
				fmt_ranks(u, sizeof(u), cross, nc);
				rc = add_finding(s, 'G', cross, nc, usite, x->unix_name ? "connect" : "shm_open",
					"%s '%s' of rank %d (replica %d) used by rank%s %s of another replica: a per-replica resource set up over a group that spans replicas",
					x->unix_name ? "socket" : "shared-memory segment", x->key, owners[0], d0, nc > 1 ? "s" : "", u);
			}
		}
	}
	free(done);
	free(owners);
	free(users);
	return rc;
}

static int rank_device(const struct a_rank *r)
{
	if (r->dev_set >= 0)
		return r->dev_set;
	if (r->dev_tensor >= 0)
		return r->dev_tensor;
	if (r->dev_nccl >= 0)
		return r->dev_nccl;
	return r->py ? -1 : r->dev_c;
}

/* D: a device not LOCAL_RANK's (the culprits, naming whose device they
 * took); two ranks of one host on one device where neither is at fault by
 * that rule (LOCAL_RANK unknown). */
static int find_d(struct st *s)
{
	int rc = 0;
	int *bad = malloc(((size_t)s->nranks + 1) * sizeof(int));
	size_t nbad = 0, off = 0;
	char detail[1024] = "", site[256] = "";
	if (!bad)
		return -ENOMEM;
	for (int a = 0; a < s->nranks; a++) {
		int da = rank_device(&s->r[a]);
		if (da < 0 || s->r[a].local_rank < 0 || da == s->r[a].local_rank)
			continue;
		char owner[64] = "";
		for (int b = 0; b < s->nranks; b++)
			if (b != a && rank_device(&s->r[b]) == da && !strcmp(s->r[a].host, s->r[b].host)) {
				snprintf(owner, sizeof(owner), ", the device of rank %d too (NCCL: \"Duplicate GPU detected\")", b);
				break;
			}
		if (!nbad)
			snprintf(site, sizeof(site), "%s", s->r[a].dev_site);
		bad[nbad++] = a;
		if (off < sizeof(detail))
			off += (size_t)snprintf(detail + off, sizeof(detail) - off, "%srank %d (LOCAL_RANK %d) selected cuda:%d%s",
				off ? "; " : "", a, s->r[a].local_rank, da, owner);
	}
	if (nbad)
		rc = add_finding(s, 'D', bad, nbad, site, "set_device",
			"%s: a device index taken from another coordinate than LOCAL_RANK (the TP rank, a masked index)", detail);
	for (int a = 0; a < s->nranks && rc == 0; a++) {
		int da = rank_device(&s->r[a]);
		if (da < 0 || s->r[a].local_rank >= 0)
			continue;
		size_t nd = 0;
		bool first = true;
		for (int b = 0; b < s->nranks; b++)
			if (b != a && rank_device(&s->r[b]) == da && !strcmp(s->r[a].host, s->r[b].host)) {
				first &= b > a;
				nd++;
			}
		if (nd && first) {
			int two[2] = {a, -1};
			for (int b = a + 1; b < s->nranks && two[1] < 0; b++)
				if (rank_device(&s->r[b]) == da && !strcmp(s->r[a].host, s->r[b].host))
					two[1] = b;
			rc = add_finding(s, 'D', two, 2, s->r[a].dev_site, "set_device",
				"ranks %d and %d of host %s both use cuda:%d (NCCL: \"Duplicate GPU detected\")", two[0], two[1],
				s->r[a].host, da);
		}
	}
	free(bad);
	return rc;
}

static int cmp_finding(const void *a, const void *b)
{
	static const char order[] = "PRICGD";
	const struct audit_finding *x = a, *y = b;
	const char *px = strchr(order, x->mech), *py = strchr(order, y->mech);
	if (px != py)
		return px < py ? -1 : 1;
	int rx = x->nranks ? x->ranks[0] : -1, ry = y->nranks ? y->ranks[0] : -1;
	return (rx > ry) - (rx < ry);
}

int audit_analyze(const char *dir, const struct dptp_layout *given, bool hung, struct audit_result *res,
		  struct dptp_err *err)
{
	struct st s = {.out = res};
	struct missing *miss = NULL;
	size_t nmiss = 0;
	int rc;
	memset(res, 0, sizeof(*res));
	if ((rc = load(&s, dir, err)) < 0)
		goto out;
	res->world = s.world;
	res->attempt = s.att < 0 ? 0 : s.att;
	res->nrecords = s.nrecords;
	for (int i = 0; i < s.nranks; i++)
		res->nrecorded += s.r[i].py || s.r[i].c;
	if (!s.world)
		goto out;
	if (given) {
		if (given->world != s.world) {
			snprintf(res->layout_how, sizeof(res->layout_how),
				"--audit-layout %dx%dx%d is %d ranks; the job recorded %d: findings not per replica", given->dp,
				given->pp, given->tp, given->world, s.world);
		} else {
			res->layout = *given;
			res->layout_known = true;
			snprintf(res->layout_how, sizeof(res->layout_how), "given (--audit-layout)");
		}
	} else {
		infer_layout(&s, res);
	}
	if ((rc = find_p(&s, hung, &miss, &nmiss)) == 0)
		rc = report_missing(&s, miss, nmiss, hung ? "; no rank progressed after that (the audit ended the hung job)" : "");
	if (rc == 0)
		rc = find_r(&s);
	if (rc == 0)
		rc = find_names(&s);
	if (rc == 0)
		rc = find_g_loop(&s);
	if (rc == 0)
		rc = find_d(&s);
	if (rc < 0)
		dptp_err_set(err, rc, "audit analysis: %s", strerror(-rc));
	else if (res->nf > 1) /* qsort's base may not be NULL, even for 0 */
		qsort(res->f, res->nf, sizeof(*res->f), cmp_finding);
out:
	free_missing(miss, nmiss);
	state_release(&s);
	return rc;
}

void audit_analyze_result_release(struct audit_result *r)
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

int audit_analyze_job(const char *dir, const struct dptp_layout *given, int hung_attempt, struct audit_report *rep,
		      struct dptp_err *err)
{
	struct audit_result res;
	memset(rep, 0, sizeof(*rep));
	int rc = audit_analyze(dir, given, hung_attempt >= 0, &res, err);
	if (rc < 0 || !res.world) {
		audit_analyze_result_release(&res);
		return rc;
	}
	if (!(rep->w = malloc(sizeof(*rep->w)))) {
		audit_analyze_result_release(&res);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	rep->w[0] = res;
	rep->nw = 1;
	rep->attempts = res.attempt + 1;
	rep->nrecords = res.nrecords;
	return 0;
}

void audit_report_release(struct audit_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nw; i++)
		audit_analyze_result_release(&r->w[i]);
	free(r->w);
	free(r->gaps);
	free(r->exits);
	memset(r, 0, sizeof(*r));
}

int audit_analyze_pending(const char *dir, char *msg, size_t len, pid_t *pids, size_t *npids, size_t maxpids, int *attempt)
{
	struct audit_result tmp = {0};
	struct st s = {.out = &tmp};
	struct missing *miss = NULL;
	size_t nmiss = 0, off = 0;
	int rc = load(&s, dir, NULL);
	*npids = 0;
	*attempt = s.att;
	msg[0] = '\0';
	if (rc == 0)
		rc = find_p(&s, true, &miss, &nmiss);
	for (size_t i = 0; rc == 0 && i < nmiss; i++) {
		if (consequence(&s, miss, nmiss, i))
			continue;
		const struct a_group *g = &s.g[miss[i].gid];
		char a[160], gr[256], sr[256];
		describe_op(a, sizeof(a), miss[i].first);
		fmt_ranks(gr, sizeof(gr), g->ranks, g->n);
		fmt_ranks(sr, sizeof(sr), miss[i].short_ranks, miss[i].nshort);
		if (off < len)
			off += (size_t)snprintf(msg + off, len - off, "%srank%s %s never entered %s at %s on group [%s]",
				off ? "; " : "", miss[i].nshort > 1 ? "s" : "", sr, a, miss[i].first->site, gr);
	}
	for (int r = 0; rc == 0 && r < s.nranks && *npids < maxpids; r++)
		if (s.r[r].pid > 0)
			pids[(*npids)++] = s.r[r].pid;
	if (rc == 0)
		rc = off > 0;
	free_missing(miss, nmiss);
	state_release(&s);
	audit_analyze_result_release(&tmp);
	return rc;
}
