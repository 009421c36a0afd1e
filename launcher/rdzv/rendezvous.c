/* Static rendezvous, one node or several, and the choice of the backend
 * (see rendezvous.h). */
#include "rdzv/rendezvous.h"
#include "log/glog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/host.h"
#include "rdzv/rdzv_c10d.h"
#include "wire/tcpstore.h"

static void uuid4(char *out, size_t len)
{
	unsigned char b[16] = {0};
	dptp_entropy(b, sizeof(b));
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void fill_common(const struct rendezvous *r, unsigned restart, struct rdzv_info *out)
{
	snprintf(out->master_addr, sizeof(out->master_addr), "%s", r->master_addr);
	out->master_port = r->master_port;
	snprintf(out->run_id, sizeof(out->run_id), "%s", r->run_id);
	out->use_agent_store = true;
	snprintf(out->store_addr, sizeof(out->store_addr), "%s", r->master_addr);
	out->store_port = r->master_port;
	snprintf(out->dptp_prefix, sizeof(out->dptp_prefix), "/%s/dptp/%u/", r->run_id, restart);
}

static int single_next(struct rendezvous *r, unsigned restart_count, struct rdzv_info *out, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	memset(out, 0, sizeof(*out));
	/* a fresh store on every attempt: nothing of the last one survives */
	rdzv_common_store_down(r);
	DPTP_TRY(rdzv_common_store_up(r, err));
	out->group_rank = o->node_rank;
	out->group_world_size = o->max_nodes;
	out->base_global_rank = 0;
	out->global_world_size = o->nproc * o->max_nodes;
	out->base_role_rank = out->base_global_rank;
	out->role_world_size = out->global_world_size;
	fill_common(r, restart_count, out);
	snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%u", (int)getpid(), restart_count);
	return 0;
}

static const struct rendezvous_ops single_ops = {
	.next = single_next,
	.shutdown = rdzv_common_shutdown,
};

/* ---- static, several nodes ---------------------------------------------- */


static int connect_clients(struct rendezvous *r, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	struct dptp_tcpstore_client_opts co = {
		.host = r->master_addr, .port = (uint16_t)r->master_port,
		.timeout = o->rdzv_timeout, .add_init = true, .abort_fd = &r->abort_fd,
		.retry_max = rdzv_common_retry_max(o->max_nodes),
	};
	struct dptp_err e = {0};
	int rc = dptp_tcpstore_client_create(&co, &r->agent, &e);
	if (rc == 0) {
		co.add_init = false; /* dptp-run's own connection does not count as a node */
		rc = dptp_tcpstore_client_create(&co, &r->ext, &e);
	}
	if (rc < 0)
		return dptp_err_set(err, rc == -EINTR ? rc : -ECONNREFUSED, "node %u cannot reach the store of node 0 at %s:%u: %s",
			o->node_rank, r->master_addr, r->master_port, e.msg);
	if (dptp_tcpstore_client_push_prefix(r->agent, r->run_id) < 0 ||
	    dptp_tcpstore_client_push_prefix(r->ext, r->run_id) < 0)
		return dptp_err_set(err, -EMSGSIZE, "run id '%s' is too long for a store key", r->run_id);
	return 0;
}

/* Has a node refused this attempt (dptp/<attempt>/refused, written by
 * refuse())? Do the nodes agree on --nnodes (node 0 publishes its count
 * under dptp/<attempt>/nnodes)? Without this, a node would wait the whole
 * rendezvous timeout for keys that a node which stopped, or counts other
 * nodes, never writes. -ECANCELED: another node refused; -EPROTO: we do. */
static int peers_agree(struct rendezvous *r, unsigned restart, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	char key[64];
	struct dptp_tcpstore_buf b = {0};
	bool there = false;
	snprintf(key, sizeof(key), "dptp/%u/refused", restart);
	const char *k1[] = {key};
	DPTP_TRY(dptp_tcpstore_client_check(r->ext, k1, 1, &there, err));
	if (there) {
		DPTP_TRY(dptp_tcpstore_client_get(r->ext, key, &b, err));
		int rc = dptp_err_set(err, -ECANCELED, "%.300s", b.data ? (char *)b.data : "");
		free(b.data);
		return rc;
	}
	if (o->node_rank == 0)
		return 0;
	snprintf(key, sizeof(key), "dptp/%u/nnodes", restart);
	DPTP_TRY(dptp_tcpstore_client_check(r->ext, k1, 1, &there, err));
	if (!there)
		return 0;
	DPTP_TRY(dptp_tcpstore_client_get(r->ext, key, &b, err));
	unsigned long n0 = strtoul(b.data ? (char *)b.data : "", NULL, 10);
	free(b.data);
	if (n0 == o->max_nodes)
		return 0;
	return dptp_err_set(err, -EPROTO, "the nodes disagree on --nnodes: node %u runs with %u, node 0 with %lu",
		o->node_rank, o->max_nodes, n0);
}

/* This node refuses the attempt (a record, role_info or assignment that is
 * forged or disagrees): the other dptp-run nodes stop too, in their
 * rendezvous (peers_agree) or, past it, on the failed attempt. */
static void refuse(struct rendezvous *r, unsigned restart, const struct dptp_err *why)
{
	char key[64], msg[400];
	snprintf(key, sizeof(key), "dptp/%u/refused", restart);
	snprintf(msg, sizeof(msg), "node %u refused the rendezvous: %.300s", r->opts->node_rank, why->msg);
	dptp_tcpstore_client_set(r->ext, key, msg, strlen(msg), NULL);
	rendezvous_report_failure(r);
}

/* Waits for keys over ext, as long as the rendezvous timeout, in 1 s slices
 * with peers_agree() in between (and once more when they are there). */
static int wait_nodes(struct rendezvous *r, unsigned restart, const char *const *keys, size_t nk,
	struct dptp_err *err)
{
	double deadline = dptp_now() + r->opts->rdzv_timeout;
	for (;;) {
		double left = deadline - dptp_now();
		int rc = dptp_tcpstore_client_wait(r->ext, keys, nk, left < 1.0 ? (left > 0 ? left : 0.001) : 1.0, err);
		if (rc == 0 || rc == -ETIMEDOUT)
			DPTP_TRY(peers_agree(r, restart, err));
		if (rc == -ETIMEDOUT && left <= 1.0)
			return dptp_err_set(err, rc, "wait timeout after %u s, keys: %s%s", r->opts->rdzv_timeout, keys[0],
				nk > 1 ? " ..." : "");
		if (rc != -ETIMEDOUT)
			return rc;
	}
}

/* This node's dptp-run record first, on its own connection (a CHECK after
 * it, which has a reply, orders it before our role_info), then the
 * role_info of torchrun's _assign_worker_ranks, byte for byte. */
static int announce_node(struct rendezvous *r, unsigned restart, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	unsigned me = o->node_rank, n = o->max_nodes;
	char key[256], val[512], nk[64], nv[16];
	const char *k1[] = {key};
	bool ready;
	int rc;

	snprintf(key, sizeof(key), "dptp/%u/node/%u", restart, me);
	snprintf(val, sizeof(val), "%u %d %u %s", o->nproc, (int)getpid(), rdzv_common_slots(), r->hostname);
	snprintf(nk, sizeof(nk), "dptp/%u/nnodes", restart);
	snprintf(nv, sizeof(nv), "%u", n);
	if ((rc = dptp_tcpstore_client_set(r->ext, key, val, strlen(val), err)) < 0 ||
	    (me == 0 && (rc = dptp_tcpstore_client_set(r->ext, nk, nv, strlen(nv), err)) < 0) ||
	    (rc = dptp_tcpstore_client_check(r->ext, k1, 1, &ready, err)) < 0)
		return rc;
	rdzv_common_role_info_value(r, me, val, sizeof(val));
	snprintf(key, sizeof(key), RDZV_RI_PREFIX "%u", me);
	return dptp_tcpstore_client_set(r->agent, key, val, strlen(val), err);
}

/* A restart: role_info of the last attempt is still there, so this waits
 * for every dptp-run node's record of this one first (keys[0] is scratch). */
static int wait_last_records(struct rendezvous *r, unsigned restart, char **keys, struct dptp_err *err)
{
	size_t nk = 0;
	for (unsigned i = 0; i < r->opts->max_nodes; i++)
		if (r->was_dptp[i])
			snprintf(keys[nk++], 96, "dptp/%u/node/%u", restart, i);
	return nk ? wait_nodes(r, restart, (const char *const *)keys, nk, err) : 0;
}

/* Node 0 assigns the ranks once every role_info is in (and says so); the
 * others wait for that, or for their own assigned_ranks the first time. */
static int agree_ranks(struct rendezvous *r, unsigned restart, bool node0_dptp, char **keys, struct dptp_err *err)
{
	unsigned me = r->opts->node_rank, n = r->opts->max_nodes;
	char key[256];
	int rc = 0;

	if (me == 0) {
		for (unsigned i = 0; i < n; i++)
			snprintf(keys[i], 96, RDZV_RI_PREFIX "%u", i);
		if ((rc = wait_nodes(r, restart, (const char *const *)keys, n, err)) < 0)
			return rc;
		/* every record preceded its node's role_info: the table first */
		for (unsigned i = 0; i < n; i++)
			snprintf(keys[i], 96, "dptp/%u/node/%u", restart, i);
		snprintf(key, sizeof(key), "dptp/%u/nodes", restart);
		if ((rc = rdzv_common_publish_nodes(r, r->ext, (const char *const *)keys, n, key, err)) < 0 ||
		    (rc = rdzv_common_node0_assign(r, r->agent, n, restart > 0, err)) < 0)
			return rc;
		snprintf(key, sizeof(key), "dptp/%u/assigned", restart);
		return dptp_tcpstore_client_set(r->ext, key, "1", 1, err);
	} else if (restart > 0 && node0_dptp) {
		/* the assigned_ranks of the last attempt are still there */
		snprintf(key, sizeof(key), "dptp/%u/assigned", restart);
		const char *k1[] = {key};
		return wait_nodes(r, restart, k1, 1, err);
	} else if (restart == 0) {
		snprintf(key, sizeof(key), RDZV_AR_PREFIX "%u", me);
		const char *k1[] = {key};
		return wait_nodes(r, restart, k1, 1, err);
	}
	return rc;
}

/* This node's assigned ranks, parsed (checked by the caller: a forged
 * assignment must not hand the workers a world of 65538). */
static int read_ranks(struct rendezvous *r, unsigned rk[4], struct dptp_err *err)
{
	struct dptp_tcpstore_buf mine = {0};
	char key[256];
	int rc;

	snprintf(key, sizeof(key), RDZV_AR_PREFIX "%u", r->opts->node_rank);
	if ((rc = dptp_tcpstore_client_get(r->agent, key, &mine, err)) >= 0)
		rc = rdzv_common_parse_ranks(&mine, rk, err);
	free(mine.data);
	return rc;
}

/* Node 0's table of the nodes (a dptp-run node 0 writes it before it
 * assigns the ranks): out->nodes, or out->mixed. The ranks are checked
 * against the records (fill_nodes), and in a mixed job against every
 * role_info. 1: no table (node 0 is not a dptp-run). */
static int read_table(struct rendezvous *r, unsigned restart, const unsigned rk[4], struct rdzv_info *out,
	struct dptp_err *err)
{
	unsigned me = r->opts->node_rank, n = r->opts->max_nodes;
	char key[64];
	bool there = false;
	const char *k1[] = {key};
	snprintf(key, sizeof(key), "dptp/%u/nodes", restart);
	DPTP_TRY(dptp_tcpstore_client_check(r->ext, k1, 1, &there, err));
	if (!there)
		return 1;
	bool learn = restart == 0 || !r->was_dptp;
	if (learn) {
		free(r->was_dptp);
		if (!(r->was_dptp = calloc(n, sizeof(bool))))
			return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	DPTP_TRY(rdzv_common_read_published(r, r->ext, key, n, me, out, learn ? r->was_dptp : NULL, err));
	if (out->mixed)
		return rdzv_common_check_ranks(r, r->ext, me, n, rk, err);
	return 0;
}

/* Is every node a dptp-run? (Their records, keys, precede their role_info,
 * which node 0 read before it assigned our ranks.) Learnt at the first
 * attempt, remembered in r->was_dptp for the restarts. */
static int all_dptp(struct rendezvous *r, unsigned restart, char **keys, bool *all, struct dptp_err *err)
{
	unsigned n = r->opts->max_nodes;
	int rc = 0;

	*all = true;
	if (restart == 0 || !r->was_dptp) {
		free(r->was_dptp);
		r->was_dptp = calloc(n, sizeof(bool));
		if (!r->was_dptp)
			return dptp_err_set(err, -ENOMEM, "out of memory");
		for (unsigned i = 0; i < n; i++) {
			const char *k1[] = {keys[i]};
			bool ready = false;
			if ((rc = dptp_tcpstore_client_check(r->ext, k1, 1, &ready, err)) < 0)
				return rc;
			r->was_dptp[i] = ready;
			*all = *all && ready;
		}
	} else {
		for (unsigned i = 0; i < n; i++)
			*all = *all && r->was_dptp[i];
	}
	return rc;
}

static int multi_next(struct rendezvous *r, unsigned restart, struct rdzv_info *out, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	unsigned me = o->node_rank, n = o->max_nodes, rk[4];
	char **keys = NULL;
	int rc = 0;
	bool node0_dptp = true, all = true;

	memset(out, 0, sizeof(*out));
	r->attempt = restart;
	r->barrier_n = n;
	if (!r->agent) {
		if (me == 0 && !r->server) {
			DPTP_TRY(rdzv_common_fd_budget(n, RDZV_FDS_PER_NODE_STATIC, err));
			DPTP_TRY(rdzv_common_store_up(r, err));
		}
		DPTP_TRY(connect_clients(r, err));
	}
	keys = calloc(n, sizeof(*keys));
	if (!keys)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (unsigned i = 0; i < n; i++)
		if (!(keys[i] = malloc(96))) {
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
			goto out;
		}

	if ((rc = announce_node(r, restart, err)) < 0)
		goto out;
	if (restart > 0 && r->was_dptp) {
		if ((rc = wait_last_records(r, restart, keys, err)) < 0)
			goto out;
		node0_dptp = r->was_dptp[0];
	}
	if ((rc = agree_ranks(r, restart, node0_dptp, keys, err)) < 0 || (rc = read_ranks(r, rk, err)) < 0)
		goto out;

	rdzv_common_info_set_ranks(out, me, n, rk);
	fill_common(r, restart, out);
	if ((rc = read_table(r, restart, rk, out, err)) <= 0) {
		if (rc == 0 && out->nodes)
			snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%u", r->nodes[0].pid, restart);
		goto out;
	}
	/* node 0 is not a dptp-run */
	if ((rc = rdzv_common_check_ranks(r, r->ext, me, n, rk, err)) < 0)
		goto out;
	for (unsigned i = 0; i < n; i++)
		snprintf(keys[i], 96, "dptp/%u/node/%u", restart, i);
	if ((rc = all_dptp(r, restart, keys, &all, err)) < 0)
		goto out;
	if (!all) {
		out->mixed = true;
		goto out;
	}
	if ((rc = rdzv_common_read_nodes(r, r->ext, (const char *const *)keys, n, me, out, err)) < 0)
		goto out;
	snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%u", r->nodes[0].pid, restart);
out:
	if (rc == -EPROTO && r->ext && err)
		refuse(r, restart, err);
	if (!out->nodes)
		snprintf(out->nspace, sizeof(out->nspace), "dptp-run.%d.%u", (int)getpid(), restart);
	dptp_tcpstore_keys_free(keys, n);
	return rc;
}

static const struct rendezvous_ops multi_ops = {
	.next = multi_next,
	.shutdown = rdzv_common_shutdown,
};

/* rendezvous_exit_barrier() but for its timeout's message: -ETIMEDOUT. */
static int exit_barrier_wait(struct rendezvous *r, double timeout, struct dptp_err *err)
{
	const char *nm = "torchelastic/agent/terminal_state/num_members";
	const char *lm = "torchelastic/agent/terminal_state/last_member";
	const char *k1[] = {lm};
	char fk[96];
	int64_t v = 0;
	double deadline = dptp_now() + timeout;
	bool watch = r->was_dptp && r->nodes;
	if (!r->multi || !r->agent)
		return 0;
	DPTP_TRY(dptp_tcpstore_client_add(r->agent, nm, 1, &v, err));
	if (v == (int64_t)r->barrier_n)
		DPTP_TRY(dptp_tcpstore_client_set(r->agent, lm, "<val_ignored>", 13, err));
	if (!watch && !r->c10d)
		return dptp_tcpstore_client_wait(r->agent, k1, 1, timeout, err);
	if (!watch) { /* c10d: waits in slices, heartbeats in between (as torch's timer thread) */
		for (;;) {
			double left = deadline - dptp_now();
			if (left <= 0)
				return -ETIMEDOUT;
			int rc = dptp_tcpstore_client_wait(r->agent, k1, 1, left < 1.0 ? left : 1.0, err);
			if (rc != -ETIMEDOUT)
				return rc;
			DPTP_TRY(rendezvous_heartbeat(r, err));
		}
	}
	/* every node a dptp-run: wait in slices and stop early when one of
	 * them reports that this attempt failed */
	snprintf(fk, sizeof(fk), "dptp/%u/failed", r->attempt);
	for (;;) {
		double left = deadline - dptp_now(), slice = left < 1.0 ? left : 1.0;
		const char *kf[] = {fk};
		bool failed = false;
		if (left <= 0)
			return -ETIMEDOUT;
		int rc = dptp_tcpstore_client_wait(r->agent, k1, 1, slice, err);
		if (rc == 0)
			return 0;
		if (rc != -ETIMEDOUT)
			return rc;
		DPTP_TRY(dptp_tcpstore_client_check(r->ext, kf, 1, &failed, err));
		if (failed)
			return 1;
	}
}

int rendezvous_exit_barrier(struct rendezvous *r, double timeout, struct dptp_err *err)
{
	int rc = exit_barrier_wait(r, timeout, err);
	if (rc == -ETIMEDOUT) /* the caller names the barrier */
		return dptp_err_set(err, rc, "not every node finished within %.0f s", timeout);
	return rc;
}

void rendezvous_report_failure(struct rendezvous *r)
{
	char key[96], val[32];
	if (!r->multi || !r->ext)
		return;
	snprintf(key, sizeof(key), "dptp/%u/failed", r->attempt);
	snprintf(val, sizeof(val), "%u", r->opts->node_rank);
	dptp_tcpstore_client_set(r->ext, key, val, strlen(val), NULL);
}

void rendezvous_report_error(struct rendezvous *r)
{
	if (r->c10d)
		rdzv_c10d_report_error(r);
	else
		rendezvous_report_failure(r);
}

int rendezvous_tick(struct rendezvous *r, struct dptp_err *err)
{
	return rdzv_c10d_tick(r, err);
}

int rendezvous_heartbeat(struct rendezvous *r, struct dptp_err *err)
{
	return rdzv_c10d_heartbeat(r, err);
}

int rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err)
{
	memset(r, 0, sizeof(*r));
	r->ops = &single_ops;
	r->opts = o;
	r->abort_fd = -1;
	dptp_hostname(r->hostname, sizeof(r->hostname));
	/* the node count bounds every table sized by it: each node runs a
	 * worker at least, this one its --nproc-per-node */
	if (o->max_nodes < 1 || o->nproc < 1 || o->nproc > RDZV_MAX_NPROC ||
	    (uint64_t)o->max_nodes - 1 + o->nproc > RDZV_MAX_WORLD)
		return dptp_err_set(err, -EINVAL, "--nnodes=%u with --nproc-per-node=%u: more than %u ranks",
			o->max_nodes, o->nproc, RDZV_MAX_WORLD);
	if (!o->standalone && !strcmp(o->rdzv_backend, "c10d") && (o->max_nodes > 1 || o->min_nodes != o->max_nodes))
		return rdzv_c10d_init(r, err);
	if (o->standalone || strcmp(o->rdzv_backend, "static")) {
		/* torchrun: c10d at localhost:0 with a uuid4 run id for
		 * --standalone; on one node every backend reduces to this:
		 * a store on a free loopback port */
		if (o->standalone)
			uuid4(r->run_id, sizeof(r->run_id));
		else
			snprintf(r->run_id, sizeof(r->run_id), "%s", o->rdzv_id);
		/* rank 0's MASTER_ADDR as torch's RendezvousStoreInfo.build:
		 * --local-addr, else socket.getfqdn(); the store binds there */
		if (o->local_addr && *o->local_addr)
			snprintf(r->master_addr, sizeof(r->master_addr), "%s", o->local_addr);
		else
			dptp_getfqdn(r->master_addr, sizeof(r->master_addr));
		snprintf(r->bind_addr, sizeof(r->bind_addr), "%s", r->master_addr);
		r->ephemeral = true;
		return 0;
	}
	snprintf(r->run_id, sizeof(r->run_id), "%s", o->rdzv_id);
	if (o->rdzv_endpoint && *o->rdzv_endpoint) {
		int port;
		DPTP_TRY(run_opts_parse_endpoint(o->rdzv_endpoint, r->master_addr, sizeof(r->master_addr), &port, err));
		if (port < 0)
			return dptp_err_set(err, -EINVAL, "Port number must be specified for StaticTCPRendezvous, endpoint: %s", o->rdzv_endpoint);
		r->master_port = (unsigned)port;
	} else {
		/* brackets of an IPv6 address already dropped by the parser */
		snprintf(r->master_addr, sizeof(r->master_addr), "%s", o->master_addr);
		r->master_port = o->master_port;
	}
	snprintf(r->bind_addr, sizeof(r->bind_addr), "%s", r->master_addr);
	if (o->max_nodes > 1) {
		if (r->master_port == 0)
			return dptp_err_set(err, -EINVAL, "--master-port=0: several nodes need a fixed port for node 0's store");
		r->ops = &multi_ops;
		r->multi = true;
		return 0;
	}
	r->ephemeral = r->master_port == 0;
	return 0;
}
