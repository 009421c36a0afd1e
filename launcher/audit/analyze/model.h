/* dptp-run --audit, the analysis's own model (audit_analyze.h is the API):
 * what load.c reads from the audit folder, shared by the mechanism files
 * (p.c r.c i.c c.c g.c d.c) through the matching helpers of match.c.
 *
 * load.c reads every file once: the C recorders' and the launcher's whole,
 * then the Python ones side by side, merged by time, each call handed to
 * calls.c as it comes (a group's window of the calls its ranks are apart by,
 * and summaries: nothing grows with the number of calls). It keeps one
 * compact record per socket, segment, NCCL or GPU event, each with the
 * process (pid) that made it. It then gives every process its world and rank: from its `world`
 * records (init_process_group) by time, else from the launcher's wstart or
 * its environment (a worker, an NCCL program: the world "" of the attempt),
 * else from the nearest ancestor that has one (a helper process). The
 * mechanism files see one world at a time (struct st). */
#ifndef DPTP_LAUNCHER_AUDIT_ANALYZE_MODEL_H
#define DPTP_LAUNCHER_AUDIT_ANALYZE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "audit/audit_analyze.h"

enum { R_SRC, R_DST, R_GSRC, R_GDST, R_N };
extern const char *const root_key[R_N];

#define A_MAXWORLDS 8 /* worlds one process may join (re-inits of one world count once) */

struct a_world {
	int att;
	char id[128];
	int size;
	int nranks_seen;
	uint64_t lk;     /* its first record's place in the files (load_key) */
	bool has_calls;  /* a call was made in it */
};

/* a process group, interned per world: its member list and creation order */
struct a_group {
	int world;
	int *ranks;
	size_t n;
	int gn;
	bool created; /* a group record named it (not only a call) */
	bool nccl;    /* an NCCL communicator of a program without Python records */
	uint64_t lk;  /* its first record's place in the files */
};

struct a_op {
	int proc;
	int world, rank; /* resolved after the load */
	int gid;         /* index into job.g */
	int pos;         /* index among this process's collectives on gid; -1: point-to-point */
	long long seq;   /* the recorder's own number on the group, 0 unknown */
	const char *op;  /* interned */
	const char *dt;  /* interned, "" unknown */
	int64_t n;
	int64_t root[R_N];
	bool has[R_N];
	bool done;       /* a `done` (or the call returned by an NCCL record) */
	bool err;        /* its `done` says it raised (a timeout, a peer gone) */
	double t;
	const char *site; /* interned */
	uint64_t lk;     /* its place in the files: process (name order), line */
};

/* a socket or shared-memory event of the C recorder */
struct a_res {
	int proc, world, rank;
	size_t ord;      /* its place in its file */
	char what;       /* 'b' bound, 'c' connected, 's' segment created, 'o' opened */
	bool excl;
	bool unix_name;  /* an AF_UNIX name (else a port or a segment) */
	bool port;
	bool recovered;  /* a failed create followed by a successful one of the same process */
	const char *key; /* interned: "@abstract", "/path", "port 5557", "/segment" */
	const char *csite; /* the C recorder's own "lib+0xoff", interned, or "" */
	const char *site; /* joined: the Python caller's, else csite */
	const char *outer; /* joined: the user's outermost frame, "" unknown */
	int rc, err;
	double t;
};

/* a GPU memory export or import of the C recorder */
struct a_gpu {
	int proc, world, rank;
	size_t ord;
	bool exp;        /* ipc_get / vmm_export (else ipc_open / vmm_import) */
	char call[16];
	const char *h;   /* interned handle hash */
	const char *csite, *site;
	const char *outer; /* the user's outermost frame, "" unknown */
	int dev, rc;
	double t;
};

/* an NCCL record of the C recorder */
struct a_nccl {
	int proc, world, rank;
	bool init;
	char id[20];     /* the communicator, by its unique id's hash */
	int nranks, crank, dt, rc;
	char op[32];
	int64_t n, root; /* root: a rank of the communicator, -1 none */
	double t;
	const char *site;
};

/* a Python `site` record, to join with the C record that follows */
struct a_site {
	int proc;
	size_t ord;
	const char *jkey; /* interned: call class + key */
	const char *site, *outer;
};

/* a per-process count record (past the cap) */
struct a_count {
	int proc;
	int gid;
	long long seq;
	long long nc;      /* its collectives ("nc"), -1 not written */
	bool has_hs;       /* "hs": the sum of the terms of the calls past the cap */
	uint64_t hs;
	char id[20];       /* the C recorder's: the NCCL communicator ("" Python's); gid -1 until nccl_ops */
};

struct a_proc {
	int att;
	pid_t pid, ppid;
	bool py, c;        /* a file of that recorder */
	bool hello_py, hello_c, c_says_py, worker, pre;
	int n_py_hello, n_c_py_image; /* Python hellos; images the C recorder saw as Python (an exec makes one more) */
	bool ended;        /* an end or exit record */
	bool torn;         /* a torn last line */
	size_t bad;        /* lines that are no record (a short write's torn line, ended by the next) */
	bool capped;
	bool capped_c;     /* the C recorder's cap (its records past it are not counted) */
	bool capped_py;    /* the Python recorder's */
	int64_t lost, dropped, cap_max; /* dropped: the part of lost the cap dropped */
	char flags[8];
	char exe[128];
	char host[64];
	int env_rank, env_world, local_rank;
	/* the worlds it joined, by time */
	int nw;
	int w[A_MAXWORLDS], wrank[A_MAXWORLDS];
	double wt[A_MAXWORLDS];
	int cur_w;         /* the world of its Python records being read, -1 none */
	/* its rank where it has no world record of its own: -1 none */
	int home_w, home_rank;
	int owner;         /* the process whose world its records belong to, -1 none */
	size_t nrec;
	bool raised;
	char exc[160];
	int dev_set, dev_tensor, dev_nccl, dev_c; /* -1 none */
	char dev_site[160];
	struct a_op *ring; /* its last A_RING calls (calls.c), NULL none */
	size_t nring;      /* its calls so far */
	bool last_nccl_op; /* its last C record was an NCCL call */
	int *cnt;          /* collectives so far per group (job.g index) */
	uint64_t *hsum;    /* per group: the sum of op_term() of its recorded collectives */
	size_t ncnt;
	/* the launcher's view */
	bool wstart, wexit;
	int wrank_l;       /* rank from wstart */
	int wlocal;        /* local rank from wstart, -1 none */
	int code, sig;
	bool core;
	double wexit_t;
};

#define A_RING 8 /* the calls kept per process: a hang's trail shows 5 */

/* one member's calls on a group from the window's base: position p at
 * v[p & (cap - 1)] for base <= p < held (op NULL: a hole) */
struct a_mwin {
	struct a_op *v;
	size_t cap, held;
	size_t len;        /* its collectives on the group */
	struct a_op last;  /* the one at len - 1 (kept after the window passed it) */
};

/* a group's calls not yet matched on every member */
struct a_win {
	size_t base;       /* positions below matched on every member and were dropped */
	bool frozen;       /* the members disagree at base: nothing past it is kept */
	struct a_mwin *m;  /* per member of the group */
	size_t n;
};

/* a map from a few words to a number (calls.c) */
struct kmap {
	uintptr_t *k;
	size_t *v;
	bool *used;
	size_t n, cap;
	unsigned words;
};

/* R: calls of one site whose root (k) lies outside their group */
struct r_bad {
	struct a_op o;     /* the first in the files */
	int k;
	int *ranks;
	size_t nranks, cap;
};

/* R: the first call of a site with root k = root inside its group gid */
struct r_in {
	uint64_t lk;
	int gid, rank, k, world;
	const char *site, *op;
	int64_t root;
};

/* R: the peers (inside the group) of a site's point-to-point calls */
struct r_twin {
	uint64_t lk;
	const char *site, *op;
	int k, world;
	int (*pair)[2];    /* (rank, peer), distinct */
	size_t n, cap;
};

/* G: the broadcasts of a site on a group by one rank, in rounds of d */
struct g_div {
	int d;
	int *cur;          /* the round being filled */
	int ncur;
	int *rounds;       /* the distinct rounds, d sources each, in order */
	size_t nrounds, caprounds;
};
struct g_agg {
	int gid, rank;
	const char *site, *op;
	size_t first_pos, nrun;
	struct g_div *d;   /* one per divisor >= 2 of the world's size */
	int nd;
};

/* a string table: each distinct string stored once */
struct a_strtab {
	char **v;
	size_t n, cap;
	size_t *slot; /* open addressing, indices + 1 */
	size_t nslot;
};

struct job {
	struct a_strtab str;
	struct a_proc *p;
	size_t np, capp;
	struct a_world *w;
	size_t nw, capw;
	struct a_group *g;
	size_t ng, capg;
	size_t *gslot; /* open addressing over g, indices + 1 */
	size_t ngslot;
	/* the calls (calls.c): nothing here grows with their number */
	struct a_win *win; /* per group */
	size_t nwin, capwin;
	size_t held, held_peak; /* positions held in windows now, at most */
	size_t ncalls;
	struct kmap steps, at_count, rbad_ix, rin_ix, twin_ix, gagg_ix;
	/* the sockets: a process's repeated successful connect to one name is
	 * kept once, and the Python sites as far as the C records they join
	 * (load.c) */
	struct kmap use_seen, cjoin, pyjoin;
	struct r_bad *rbad;
	size_t nrbad, caprbad;
	struct r_in *rin;
	size_t nrin, caprin;
	struct r_twin *twin;
	size_t ntwin, captwin;
	struct g_agg *gagg;
	size_t ngagg, capgagg;
	uint64_t cur_lk;   /* the record being read: its load_key */
	uint64_t late_lk;  /* for what is made after the load */
	struct a_res *res;
	size_t nres, capres;
	struct a_gpu *gpu;
	size_t ngpu, capgpu;
	struct a_nccl *nccl;
	size_t nnccl, capnccl;
	struct a_site *sites;
	size_t nsites, capsites;
	struct a_count *cnt;
	size_t ncnt, capcnt;
	struct audit_exit *exits;
	size_t nexits, capexits;
	struct audit_gap *jgaps;
	size_t njgaps, capjgaps;
	size_t nrecords;
	int maxatt;
	double *hang_t;     /* per attempt: when the hang watch ended it, 0 never */
	size_t nhang_t;
	bool have_launcher; /* launcher.jsonl was there */
};

/* a world's rank, gathered from its processes */
struct a_rank {
	bool rec;           /* some process of it recorded */
	bool py, c, exited, raised, capped;
	bool call_failed;   /* its last call raised (its exception came from torch.distributed) */
	bool nccl;          /* no Python records: its sequences are NCCL's */
	int proc;           /* its (first) process, -1 none */
	int local_rank;
	pid_t pid;
	char host[64];
	char exc[160];
	int dev;            /* the device it selected, -1 none */
	char dev_site[160];
	const struct a_op *last_op; /* its last call, NULL none */
	int sig;            /* the signal the launcher saw it end by, 0 none */
	bool core;
};

/* one world under analysis */
struct st {
	struct job *j;
	int world;          /* index into j->w */
	int att, size;
	struct a_rank *r;   /* [size] */
	size_t *gorder;     /* this world's groups in the order the files name them */
	size_t ngorder;
	struct audit_result *out;
	size_t capf, capgaps;
};

/* ---- load.c ---- */
int job_load(struct job *j, const char *dir, struct dptp_err *err);
int proc_count(struct a_proc *p, int gid);
void job_release(struct job *j);
const char *str_intern(struct a_strtab *t, const char *s);

/* ---- match.c ---- */
int grow(void **p, size_t *cap, size_t want, size_t sz);
void *push(void *pv, size_t *n, size_t *cap, size_t sz);
bool is_p2p(const char *op);
bool sized(const char *op);
bool in_list(const int *v, size_t n, int64_t x);
int cmp_int(const void *a, const void *b);
int group_intern(struct job *j, int world, const int64_t *ranks, size_t n, int gn);
void infer_layout(struct st *s, const struct dptp_layout *given);
int replica_of(const struct audit_result *res, int rank);
void fmt_ranks(char *buf, size_t len, const int *v, size_t n);
__attribute__((format(printf, 7, 8)))
int add_finding(struct st *s, char mech, const int *ranks, size_t nranks, const char *site, const char *op,
		const char *fmt, ...);
int set_group(struct audit_finding *f, const int *ranks, size_t n);
__attribute__((format(printf, 4, 5)))
int add_gap(struct st *s, int rank, pid_t pid, const char *fmt, ...);
/* " (called from OUTER)" when outer is known and not site itself, else "" */
void called_from(char *buf, size_t len, const char *site, const char *outer);
void describe_op(char *buf, size_t len, const struct a_op *o);
bool same_call(const struct a_op *a, const struct a_op *b);
/* the contract's term of a collective at 0-based position pos on its group:
 * splitmix64_final(FNV-1a 64 of "op|n|dt|k=v,..." + pos * golden) */
uint64_t sig_hash(const char *sig);
uint64_t op_term(const char *op, int64_t n, const char *dt, const bool *has, const int64_t *root, long long pos);
bool group_spans_replicas(const struct st *s, const struct a_group *g);

/* the collectives of each member on one group, as its window holds them */
struct seqs {
	const struct a_win *w;
	bool *in;           /* in[member]: the member's calls are compared (a rank with records) */
	size_t *len;        /* its collectives on the group */
	size_t n;
	size_t base;        /* positions below were matched and dropped */
};
int build_seqs(const struct st *s, int gid, struct seqs *q);
void free_seqs(struct seqs *q);
/* member m's call at position k, NULL when not held (or a hole) */
const struct a_op *seq_at(const struct seqs *q, size_t m, size_t k);
/* member m's last call on the group, NULL none */
const struct a_op *seq_last(const struct seqs *q, size_t m);

/* ---- calls.c ---- */
void calls_init(struct job *j);
void calls_release(struct job *j);
int calls_add(struct job *j, const struct a_op *o);
void calls_done(struct a_proc *p, int gid, long long seq, bool err);
/* back 0: the process's last call, 1 the one before...; NULL none */
const struct a_op *proc_call(const struct a_proc *p, size_t back);
const struct a_op *win_at(const struct a_win *w, size_t m, size_t pos);
/* did process proc step from prev (NULL: its first call) to a call like cur? */
bool calls_step(const struct job *j, int proc, const struct a_op *prev, const struct a_op *cur);
/* rank's collectives on gid with that op and site */
size_t calls_at(const struct job *j, int gid, int rank, const char *op, const char *site);
size_t *kmap_get(struct kmap *m, const uintptr_t *key, bool add);
/* the groups of this world, in j->g order: iterate gid with world_group() */
bool world_group(const struct st *s, size_t gid);

/* ---- the mechanisms, one file each ---- */
int find_p(struct st *s, bool hung);
/* a process's calls past its record cap are compared (every member of each
 * group it counted has a count and a sum, or all its calls recorded) */
bool cap_compared(const struct st *s, int proc);
int find_r(struct st *s);
/* names.c: the sockets, ports and segments by name, for I, C and G */
struct name_use {
	const char *key;
	bool port, unix_name, segment, excl;
	int *owners;     /* sorted */
	size_t no;
	int *users;      /* connect / open without create, succeeded */
	size_t nu;
	size_t ncoll;    /* creates that failed (not recovered) */
	int coll_err;
	const char *site, *usite;
	const char *outer, *uouter; /* the user's outermost frames of site and usite, "" unknown */
	bool reps;       /* owners of different replicas */
};
int names_collect(struct st *s, struct name_use **out, size_t *n);
void names_release(struct name_use *u, size_t n);
bool name_collides(const struct name_use *u);
const char *collision_how(const struct name_use *u);
int find_i(struct st *s, const struct name_use *u, size_t n);
int find_c(struct st *s, const struct name_use *u, size_t n);
int find_g(struct st *s, const struct name_use *u, size_t n);
int find_d(struct st *s);

/* ---- p.c: the hang ---- */
/* the replica behind on some group when every live rank waits in a
 * collective: 1 with msg set (and a P finding with its trail added to
 * s->out when add); 0 when a live rank is outside any collective (working);
 * 2 when every live rank waits but no one is behind, or none is left; or
 * -ENOMEM */
int hang_blame(struct st *s, bool add, char *msg, size_t len);

/* ---- analyze.c ---- */
int world_open(struct st *s, struct job *j, int world, struct audit_result *out);
void world_close(struct st *s);

#endif
