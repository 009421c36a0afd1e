/* What the static and the c10d rendezvous share (see rdzv_common.h): this
 * node's name and slots, the agent store, torchrun's rank assignment over
 * the store and dptp-run's node records. */
#include "rdzv/rdzv_common.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/json.h"
#include "log/glog.h"
#include "wire/tcpstore.h"

unsigned rdzv_common_slots(void)
{
	cpu_set_t set;
	unsigned n = 0, cores = 0;
	long seen[CPU_SETSIZE];
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return 1;
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		char path[96];
		long pkg = -1, core = cpu, key;
		if (!CPU_ISSET(cpu, &set))
			continue;
		n++;
		FILE *f;
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%ld", &pkg) != 1)
				pkg = -1;
			fclose(f);
		}
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%ld", &core) != 1)
				core = cpu;
			fclose(f);
		}
		key = (pkg + 1) * 1000000 + core;
		unsigned k = 0;
		while (k < cores && seen[k] != key)
			k++;
		if (k == cores)
			seen[cores++] = key;
	}
	return cores ? cores : n ? n : 1;
}

void rdzv_common_json_str(const char *s, char *out, size_t len)
{
	struct dptp_buf b = {0};
	dptp_json_str(&b, s, strlen(s), 0);
	snprintf(out, len, "%s", b.oom ? "" : (const char *)b.buf);
	dptp_buf_release(&b);
}

/* ---- the agent store ---------------------------------------------------- */

/* The agent store's one line at its first refusal past the memory budget. */
static void store_log(void *arg, const char *msg)
{
	char pre[64];
	glog_prefix('W', pre, sizeof(pre));
	fprintf(stderr, "%s%s\n", pre, msg);
}

int rdzv_common_fd_budget(unsigned nodes, unsigned per_node, struct dptp_err *err)
{
	/* each node holds a few connections to the store: the agent's one,
	 * its cross-node PMIx ones (serving, heartbeats, a fence or two) */
	rlim_t need = (rlim_t)nodes * per_node + 256;
	/* what the host raises its soft limit to where it can: a quarter more
	 * (the peak measured 4.4-4.9 per node at 4096 and 1024 nodes of
	 * /bin/true, where nodes' exchanges at worker start and end overlap) */
	rlim_t room = need + need / 4;
	/* and what the store keeps for the rest of this process past its
	 * connections (32 + the limit / 32: tcpstore_server.c fds_short) */
	room += 32 + room / 31;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= room)
		return 0;
	rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > room ? room : rl.rlim_max;
	struct rlimit nl = {.rlim_cur = want, .rlim_max = rl.rlim_max};
	if (want > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &nl) == 0)
		rl.rlim_cur = want;
	/* past the hard limit where this process may (CAP_SYS_RESOURCE, as
	 * root in a container; up to fs.nr_open) */
	for (rlim_t to = room; rl.rlim_cur < need && to >= need; to = to > need ? need : 0) {
		nl.rlim_cur = nl.rlim_max = to;
		if (setrlimit(RLIMIT_NOFILE, &nl) == 0)
			rl.rlim_cur = rl.rlim_max = to;
	}
	if (rl.rlim_cur >= need)
		return 0;
	return dptp_err_set(err, -EMFILE, "the store of %u nodes needs about %llu descriptors, and RLIMIT_NOFILE allows "
		"%llu (hard limit %llu): raise it (ulimit -n, limits.conf) or run fewer nodes", nodes,
		(unsigned long long)need, (unsigned long long)rl.rlim_cur,
		(unsigned long long)(rl.rlim_max == RLIM_INFINITY ? 0 : rl.rlim_max));
}

double rdzv_common_retry_max(unsigned nodes)
{
	double s = 0.05 + 0.0001 * (double)nodes;
	return s < 1.0 ? s : 1.0;
}

int rdzv_common_store_up(struct rendezvous *r, struct dptp_err *err)
{
	struct dptp_tcpstore_server_opts so = {
		.host = r->bind_addr,
		.port = r->ephemeral ? 0 : (uint16_t)r->master_port,
		.log = store_log,
	};
	struct dptp_err e = {0};
	if (dptp_tcpstore_server_create(&so, &r->server, &e) < 0)
		return dptp_err_set(err, -EADDRINUSE, "cannot host the agent store at %s port %u: %s",
			r->bind_addr, r->ephemeral ? 0u : r->master_port, e.msg);
	if (dptp_tcpstore_server_start(r->server, &e) < 0) {
		dptp_tcpstore_server_destroy(r->server);
		r->server = NULL;
		return dptp_err_set(err, -EIO, "cannot start the agent store: %s", e.msg);
	}
	r->master_port = dptp_tcpstore_server_port(r->server);
	return 0;
}

void rdzv_common_store_stats(struct dptp_tcpstore_server *s)
{
	const char *e = getenv("DPTP_STORE_STATS");
	char line[2048];
	if (!s || !e || !*e || !strcmp(e, "0"))
		return;
	dptp_tcpstore_server_stop(s);
	dptp_tcpstore_server_stats(s, line, sizeof(line));
	fprintf(stderr, "dptp-run: store stats: %s\n", line);
}

void rdzv_common_store_down(struct rendezvous *r)
{
	rdzv_common_store_stats(r->server);
	dptp_tcpstore_server_destroy(r->server);
	r->server = NULL;
}

static void close_clients(struct rendezvous *r)
{
	dptp_tcpstore_client_destroy(r->agent);
	dptp_tcpstore_client_destroy(r->ext);
	r->agent = r->ext = NULL;
}

void rdzv_common_shutdown(struct rendezvous *r)
{
	close_clients(r);
	/* node 0: the other nodes may still be reading the exit barrier's
	 * reply, or closing the rendezvous; give them up to 5 s, and 5 ms
	 * more per node, to hang up before the store goes (2048 c10d nodes on
	 * 2 cores: 90 were still closing after 5 s) */
	if (r->multi && r->server && !r->no_grace) {
		double until = dptp_now() + 5.0 + 0.005 * r->barrier_n;
		while (dptp_tcpstore_server_nclients(r->server) > 0 && dptp_now() < until) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	rdzv_common_store_down(r);
	free(r->nodes);
	free(r->was_dptp);
	r->nodes = NULL;
	r->was_dptp = NULL;
}

/* From '{"role": "x", "rank": 1, "local_world_size": 2}': the role as its
 * JSON text (compared raw) and local_world_size. */
static int parse_role_info(const struct dptp_tcpstore_buf *b, unsigned node, char *role, size_t rlen,
	unsigned *lws, struct dptp_err *err)
{
	const char *s = (const char *)b->data, *p, *q;
	char *end;
	unsigned long v;
	if (!s || !(p = strstr(s, "\"role\": \"")))
		goto bad;
	p += strlen("\"role\": ");
	for (q = p + 1; *q && *q != '"'; q++)
		if (*q == '\\' && q[1])
			q++;
	if (*q != '"' || (size_t)(q - p + 2) > rlen)
		goto bad;
	snprintf(role, rlen, "%.*s", (int)(q - p + 1), p);
	if (!(p = strstr(s, "\"local_world_size\": ")))
		goto bad;
	v = strtoul(p + strlen("\"local_world_size\": "), &end, 10);
	if (end == p + strlen("\"local_world_size\": ") || v > UINT_MAX)
		goto bad;
	*lws = (unsigned)v;
	return 0;
bad:
	return dptp_err_set(err, -EPROTO, "node %u's role_info is not torchrun's: '%.200s'", node, s ? s : "");
}

/* json.dumps of four ints: "[a, b, c, d]", each 0..UINT_MAX, nothing else
 * (sscanf's %u would take 4294967300 as 4). */
int rdzv_common_parse_ranks(const struct dptp_tcpstore_buf *b, unsigned v[4], struct dptp_err *err)
{
	const char *s = (const char *)b->data, *p = s;
	for (int i = 0; p && i < 4; i++) {
		char *end;
		if (*p++ != (i ? ',' : '[') || (i && *p++ != ' ') || *p < '0' || *p > '9')
			goto bad;
		errno = 0;
		unsigned long long x = strtoull(p, &end, 10);
		if (errno || x > UINT_MAX)
			goto bad;
		v[i] = (unsigned)x;
		p = end;
	}
	if (p && p[0] == ']' && !p[1])
		return 0;
bad:
	return dptp_err_set(err, -EPROTO, "assigned_ranks '%.100s' is not \"[base, world, role base, role world]\"",
		s ? s : "");
}

/* Node 0 on a restart: every key but init/ and the run's agent keys goes. */
static int clear_worker_keys(struct rendezvous *r, struct dptp_err *err)
{
	char **keys = NULL, ta[128], dp[128];
	size_t n = 0;
	int rc;
	snprintf(ta, sizeof(ta), "/%s/torchelastic/", r->run_id);
	snprintf(dp, sizeof(dp), "/%s/dptp/", r->run_id);
	if ((rc = dptp_tcpstore_client_set_prefix(r->ext, "")) < 0)
		return dptp_err_set(err, rc, "out of memory");
	rc = dptp_tcpstore_client_list_keys(r->ext, &keys, &n, err);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		if (!strcmp(keys[i], "init/") || !strncmp(keys[i], ta, strlen(ta)) || !strncmp(keys[i], dp, strlen(dp)))
			continue;
		rc = dptp_tcpstore_client_delete_key(r->ext, keys[i], NULL, err);
	}
	dptp_tcpstore_keys_free(keys, n);
	if (dptp_tcpstore_client_set_prefix(r->ext, "/") < 0 || dptp_tcpstore_client_push_prefix(r->ext, r->run_id) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	return rc;
}

struct role_infos {
	unsigned n;
	char (*roles)[160];
	unsigned *lws;
};

static void role_infos_free(struct role_infos *ri)
{
	free(ri->roles);
	free(ri->lws);
	ri->roles = NULL;
	ri->lws = NULL;
}

/* Every node's role_info (role_info/0..n-1) over c: each 1..RDZV_MAX_NPROC
 * workers, RDZV_MAX_WORLD at most in all, node `me`'s own as it wrote it
 * (role and --nproc-per-node). wait: wait for the keys (node 0) or refuse
 * missing ones at once (the others: node 0 assigned from all of them). */
static int read_role_infos(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n,
	bool wait, struct role_infos *ri, struct dptp_err *err)
{
	char **keys = calloc(n, sizeof(*keys)), own[160];
	struct dptp_tcpstore_buf *bufs = NULL;
	uint64_t global = 0;
	int rc = 0;
	ri->n = n;
	ri->lws = calloc(n, sizeof(*ri->lws));
	ri->roles = calloc(n, sizeof(*ri->roles));
	if (!ri->lws || !ri->roles || !keys)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; rc == 0 && i < n; i++)
		if (!(keys[i] = malloc(96)))
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
		else
			snprintf(keys[i], 96, RDZV_RI_PREFIX "%u", i);
	bool all = wait;
	if (rc == 0 && !wait)
		rc = dptp_tcpstore_client_check(c, (const char *const *)keys, n, &all, err);
	for (unsigned i = 0; rc == 0 && !all && i < n; i++) { /* which one */
		const char *k1[] = {keys[i]};
		bool ready = false;
		if ((rc = dptp_tcpstore_client_check(c, k1, 1, &ready, err)) == 0 && !ready)
			rc = dptp_err_set(err, -EPROTO, "node %u's role_info is missing, yet ranks were assigned: "
				"do all nodes run with --nnodes=%u?", i, n);
	}
	if (rc == 0)
		rc = dptp_tcpstore_client_multi_get(c, (const char *const *)keys, n, &bufs, err);
	rdzv_common_json_str(r->opts->role, own, sizeof(own));
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		rc = parse_role_info(&bufs[i], i, ri->roles[i], sizeof(ri->roles[i]), &ri->lws[i], err);
		if (rc == 0 && (ri->lws[i] < 1 || ri->lws[i] > RDZV_MAX_NPROC))
			rc = dptp_err_set(err, -EPROTO, "node %u's role_info claims %u workers (1..%u per node)", i,
				ri->lws[i], RDZV_MAX_NPROC);
		else if (rc == 0 && i == me && (ri->lws[i] != r->opts->nproc || strcmp(ri->roles[i], own)))
			rc = dptp_err_set(err, -EPROTO, "this node's role_info '%.200s' is not what it wrote "
				"(role %s, %u workers)", (char *)bufs[i].data, own, r->opts->nproc);
		global += ri->lws[i];
	}
	if (rc == 0 && global > RDZV_MAX_WORLD)
		rc = dptp_err_set(err, -EPROTO, "the nodes' role_info add up to %llu workers (at most %u)",
			(unsigned long long)global, RDZV_MAX_WORLD);
	if (bufs)
		dptp_tcpstore_bufs_free(bufs, n);
	if (keys)
		dptp_tcpstore_keys_free(keys, n);
	if (rc < 0)
		role_infos_free(ri);
	return rc;
}

/* torchrun's assignment of node i: ranks in group-rank order, role ranks
 * per role: [base, world, role base, role world]. */
static void assignment_of(const struct role_infos *ri, unsigned i, unsigned v[4])
{
	memset(v, 0, 4 * sizeof(*v));
	for (unsigned j = 0; j < ri->n; j++) {
		bool same = !strcmp(ri->roles[j], ri->roles[i]);
		v[1] += ri->lws[j];
		v[0] += j < i ? ri->lws[j] : 0;
		v[3] += same ? ri->lws[j] : 0;
		v[2] += same && j < i ? ri->lws[j] : 0;
	}
}

/* torchrun's node 0 in _assign_worker_ranks: MULTI_GET every role_info,
 * ranks in group-rank order (role ranks per role), MULTI_SET every
 * assigned_ranks. clear: drop the last attempt's worker keys in between
 * (static, where the workers share this store). */
int rdzv_common_node0_assign(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned n, bool clear,
	struct dptp_err *err)
{
	struct role_infos ri = {0};
	char **keys = calloc(n, sizeof(*keys));
	struct dptp_tcpstore_buf *vals = calloc(n, sizeof(*vals));
	int rc = 0;
	if (!vals || !keys)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	if (rc == 0)
		rc = read_role_infos(r, c, 0, n, true, &ri, err);
	if (rc == 0 && clear)
		rc = clear_worker_keys(r, err);
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		unsigned v4[4];
		char v[96];
		assignment_of(&ri, i, v4);
		snprintf(v, sizeof(v), "[%u, %u, %u, %u]", v4[0], v4[1], v4[2], v4[3]);
		if (!(keys[i] = malloc(96)) || !(vals[i].data = (uint8_t *)strdup(v))) {
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
			break;
		}
		snprintf(keys[i], 96, RDZV_AR_PREFIX "%u", i);
		vals[i].len = strlen(v);
	}
	if (rc == 0)
		rc = dptp_tcpstore_client_multi_set(c, (const char *const *)keys, vals, n, err);
	if (vals)
		dptp_tcpstore_bufs_free(vals, n);
	if (keys)
		dptp_tcpstore_keys_free(keys, n);
	role_infos_free(&ri);
	return rc;
}

int rdzv_common_check_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n,
	const unsigned rk[4], struct dptp_err *err)
{
	unsigned nproc = r->opts->nproc, want[4];
	struct role_infos ri = {0};
	/* cheap bounds first: a forged world of 2^20 + 2 is refused as it is */
	if (rk[1] > RDZV_MAX_WORLD || rk[1] < n || (uint64_t)rk[0] + nproc > rk[1] || rk[3] > rk[1] ||
	    (uint64_t)rk[2] + nproc > rk[3])
		return dptp_err_set(err, -EPROTO, "assigned_ranks [%u, %u, %u, %u] of node %u do not fit its %u workers "
			"(base + nproc <= world <= %u, %u nodes)", rk[0], rk[1], rk[2], rk[3], me, nproc, RDZV_MAX_WORLD, n);
	DPTP_TRY(read_role_infos(r, c, me, n, false, &ri, err));
	assignment_of(&ri, me, want);
	role_infos_free(&ri);
	if (memcmp(want, rk, sizeof(want)))
		return dptp_err_set(err, -EPROTO, "assigned_ranks [%u, %u, %u, %u] of node %u disagree with the nodes' "
			"role_info, which give [%u, %u, %u, %u]", rk[0], rk[1], rk[2], rk[3], me, want[0], want[1], want[2],
			want[3]);
	return 0;
}

void rdzv_common_role_info_value(const struct rendezvous *r, unsigned me, char *val, size_t len)
{
	char role[160];
	rdzv_common_json_str(r->opts->role, role, sizeof(role));
	snprintf(val, len, "{\"role\": %s, \"rank\": %u, \"local_world_size\": %u}", role, me, r->opts->nproc);
}

void rdzv_common_info_set_ranks(struct rdzv_info *out, unsigned me, unsigned n, const unsigned rk[4])
{
	out->group_rank = me;
	out->group_world_size = n;
	out->base_global_rank = rk[0];
	out->global_world_size = rk[1];
	out->base_role_rank = rk[2];
	out->role_world_size = rk[3];
}

int rdzv_common_assign_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n, unsigned rk[4],
	struct dptp_err *err)
{
	char key[96], val[512];
	struct dptp_tcpstore_buf mine = {0};
	int rc;
	rdzv_common_role_info_value(r, me, val, sizeof(val));
	snprintf(key, sizeof(key), RDZV_RI_PREFIX "%u", me);
	DPTP_TRY(dptp_tcpstore_client_set(c, key, val, strlen(val), err));
	if (me == 0)
		DPTP_TRY(rdzv_common_node0_assign(r, c, n, false, err));
	snprintf(key, sizeof(key), RDZV_AR_PREFIX "%u", me);
	if ((rc = dptp_tcpstore_client_get(c, key, &mine, err)) == 0)
		rc = rdzv_common_parse_ranks(&mine, rk, err);
	free(mine.data);
	return rc;
}

/* The nodes' records (bufs[i], NUL-terminated) to r->nodes and out->nodes. */
static int fill_nodes(struct rendezvous *r, const struct dptp_tcpstore_buf *bufs, unsigned n, unsigned me,
	struct rdzv_info *out, struct dptp_err *err)
{
	uint64_t base = 0;
	int rc;
	free(r->nodes);
	r->nodes = calloc(n, sizeof(*r->nodes));
	rc = r->nodes ? 0 : dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		struct rdzv_node *nd = &r->nodes[i];
		int used = 0;
		if (!bufs[i].data || sscanf((char *)bufs[i].data, "%u %d %u %n", &nd->nproc, &nd->pid, &nd->slots, &used) < 3 ||
		    !used) {
			rc = dptp_err_set(err, -EPROTO, "node %u's dptp record is malformed: '%.100s'", i,
				bufs[i].data ? (char *)bufs[i].data : "");
			break;
		}
		if (nd->nproc < 1 || nd->nproc > RDZV_MAX_NPROC || nd->pid <= 0 ||
		    (i == me && nd->nproc != r->opts->nproc)) {
			rc = dptp_err_set(err, -EPROTO, "node %u's dptp record '%.100s' claims %u workers (pid %d); "
				"expected 1..%u%s", i, (char *)bufs[i].data, nd->nproc, nd->pid, RDZV_MAX_NPROC,
				i == me ? ", and this node's own --nproc-per-node" : "");
			break;
		}
		snprintf(nd->host, sizeof(nd->host), "%s", (char *)bufs[i].data + used);
		nd->base = (unsigned)base;
		base += nd->nproc;
	}
	if (rc == 0 && (base != out->global_world_size || r->nodes[me].base != out->base_global_rank))
		rc = dptp_err_set(err, -EPROTO, "the nodes' records (%llu ranks) disagree with assigned_ranks (world %u)",
			(unsigned long long)base, out->global_world_size);
	if (rc < 0)
		return rc;
	r->nnodes = n;
	out->nodes = r->nodes;
	return 0;
}

int rdzv_common_read_nodes(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *const *keys, unsigned n,
	unsigned me, struct rdzv_info *out, struct dptp_err *err)
{
	struct dptp_tcpstore_buf *bufs = NULL;
	DPTP_TRY(dptp_tcpstore_client_multi_get(c, keys, n, &bufs, err));
	int rc = fill_nodes(r, bufs, n, me, out, err);
	dptp_tcpstore_bufs_free(bufs, n);
	return rc;
}

int rdzv_common_publish_nodes(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *const *keys, unsigned n,
	const char *agg_key, struct dptp_err *err)
{
	struct dptp_buf b = {0};
	struct dptp_tcpstore_buf *bufs = NULL;
	bool all = false;
	int rc = dptp_tcpstore_client_check(c, keys, n, &all, err);
	if (rc == 0 && all && (rc = dptp_tcpstore_client_multi_get(c, keys, n, &bufs, err)) == 0) {
		dptp_buf_adds(&b, "nodes");
		for (unsigned i = 0; i < n; i++) {
			if (memchr(bufs[i].data, '\n', bufs[i].len)) {
				rc = dptp_err_set(err, -EPROTO, "node %u's dptp record has a newline: '%.100s'", i,
					(char *)bufs[i].data);
				break;
			}
			dptp_buf_addc(&b, '\n');
			dptp_buf_add(&b, bufs[i].data, bufs[i].len);
		}
		dptp_tcpstore_bufs_free(bufs, n);
	} else if (rc == 0) { /* which ones: the restarts wait for those */
		dptp_buf_adds(&b, "mixed ");
		for (unsigned i = 0; rc == 0 && i < n; i++) {
			bool there = false;
			rc = dptp_tcpstore_client_check(c, keys + i, 1, &there, err);
			dptp_buf_addc(&b, there ? '1' : '0');
		}
	}
	if (rc == 0 && b.oom)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	if (rc == 0)
		rc = dptp_tcpstore_client_set(c, agg_key, b.buf, b.len, err);
	if (rc == 0) /* a reply: the value is in before node 0 writes elsewhere */
		rc = dptp_tcpstore_client_check(c, &agg_key, 1, &all, err);
	dptp_buf_release(&b);
	return rc;
}

int rdzv_common_read_published(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *agg_key, unsigned n,
	unsigned me, struct rdzv_info *out, bool *was_dptp, struct dptp_err *err)
{
	struct dptp_tcpstore_buf b = {0};
	struct dptp_tcpstore_buf *views = NULL;
	int rc;
	out->mixed = false;
	DPTP_TRY(dptp_tcpstore_client_get(c, agg_key, &b, err));
	char *s = (char *)b.data;
	if (s && b.len == 6 + (size_t)n && !strncmp(s, "mixed ", 6) && strspn(s + 6, "01") == n) {
		for (unsigned i = 0; was_dptp && i < n; i++)
			was_dptp[i] = s[6 + i] == '1';
		out->mixed = n > 1;
		free(b.data);
		return 0;
	}
	if (!s || strncmp(s, "nodes\n", 6) || !(views = calloc(n, sizeof(*views)))) {
		rc = views || !s || strncmp(s, "nodes\n", 6) ? dptp_err_set(err, -EPROTO,
			"node 0's table of the nodes '%.60s' is neither \"nodes\\n...\" nor \"mixed 0101...\"", s ? s : "")
			: dptp_err_set(err, -ENOMEM, "out of memory");
		free(b.data);
		return rc;
	}
	char *p = s + 6;
	unsigned i = 0;
	for (; i < n && p; i++) {
		char *nl = strchr(p, '\n');
		if (nl)
			*nl = 0;
		views[i].data = (uint8_t *)p;
		views[i].len = strlen(p);
		p = nl ? nl + 1 : NULL;
	}
	if (i != n || p)
		rc = dptp_err_set(err, -EPROTO, "node 0's table of the nodes has %s records, not %u", p ? "more" : "fewer", n);
	else
		rc = fill_nodes(r, views, n, me, out, err);
	for (unsigned k = 0; rc == 0 && was_dptp && k < n; k++)
		was_dptp[k] = true;
	free(views);
	free(b.data);
	return rc;
}
