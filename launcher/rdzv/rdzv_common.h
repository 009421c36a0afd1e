/* What the static and the c10d rendezvous share: the rendezvous itself
 * (struct rendezvous, the backends' ops), what a node learns from it
 * (struct rdzv_info), and the helpers both backends use: the agent store,
 * torchrun's rank assignment, dptp-run's node records (rdzv_common.c). */
#ifndef DPTP_LAUNCHER_RDZV_COMMON_H
#define DPTP_LAUNCHER_RDZV_COMMON_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/run_opts.h"

struct dptp_tcpstore_server;
struct dptp_tcpstore_client;

/* What the store may claim (issue 14 item 9): a node runs at most what
 * --nproc-per-node allows, a job at most 2^20 ranks. A record or an
 * assignment past these, or one that disagrees with the nodes' role_info or
 * this node's command line, is refused (-EPROTO, one line) before anything
 * is allocated for it or handed to a worker. */
#define RDZV_MAX_NPROC 4096u
#define RDZV_MAX_WORLD (1u << 20)

struct rdzv_node {
	unsigned nproc;
	unsigned base; /* first global rank */
	unsigned slots; /* cores its workers may use (rdzv_common_slots) */
	int pid;
	char host[256];
};

struct rdzv_info {
	unsigned group_rank, group_world_size;
	unsigned base_global_rank, global_world_size;
	unsigned base_role_rank, role_world_size;
	char master_addr[256];
	unsigned master_port;
	char run_id[64];
	/* TORCHELASTIC_USE_AGENT_STORE: true when node 0's launcher hosts a
	 * TCPStore at master_addr:master_port for the workers. */
	bool use_agent_store;
	/* Several nodes, every one a dptp-run: the job's node table (borrowed
	 * from the rendezvous, valid until the next attempt) and the PMIx
	 * namespace every node registers. nodes == NULL otherwise. */
	const struct rdzv_node *nodes;
	bool mixed; /* several nodes and some are not dptp-run */
	char nspace[128];
	/* raw store keys of dptp-run's own (cross-node fences, heartbeats,
	 * failure reports): "/<run_id>/dptp/<attempt>/" (static) or
	 * "/torch.rendezvous.<run_id>.<round>/dptp/" (c10d), on the store at
	 * store_addr:store_port (node 0's agent store, the c10d endpoint) */
	char dptp_prefix[128];
	char store_addr[256];
	unsigned store_port;
};

struct rendezvous;

struct rendezvous_ops {
	/* Called before every attempt (restarts included). */
	int (*next)(struct rendezvous *r, unsigned restart_count, struct rdzv_info *out, struct dptp_err *err);
	void (*shutdown)(struct rendezvous *r);
};

struct rendezvous {
	const struct rendezvous_ops *ops;
	const struct run_opts *opts;
	char run_id[64];
	char master_addr[256];
	unsigned master_port;
	char bind_addr[256];
	bool ephemeral; /* a free port on each attempt */
	bool multi;
	struct dptp_tcpstore_server *server;
	struct dptp_tcpstore_client *agent, *ext;
	struct rdzv_node *nodes;
	bool *was_dptp; /* per node, from attempt 0 */
	unsigned nnodes;
	unsigned attempt;
	unsigned barrier_n; /* nodes in the exit barrier */
	char hostname[256];
	/* a signalfd of the death signals (-1: none): every wait of the
	 * rendezvous ends with -EINTR once one is pending */
	int abort_fd;
	bool info_log; /* LOGLEVEL=INFO: torch's INFO lines */
	bool quick;    /* ended by a signal's default action: no close */
	bool no_grace; /* ended by a signal: the store host does not wait for the others to hang up */
	struct rdzv_c10d *c10d; /* c10d several nodes (rdzv_c10d.c) */
};

/* torchrun's keys of the rank assignment */
#define RDZV_RI_PREFIX "torchelastic/role_info/"
#define RDZV_AR_PREFIX "torchelastic/assigned_ranks/"

/* assigned_ranks rk of group rank me of n: within the bounds above, and
 * equal to torchrun's assignment computed again from every node's role_info
 * read over c (not the agent connection, whose bytes are torchrun's), which
 * must all be there (node 0 assigned from them), this node's own being its
 * command line. */
int rdzv_common_check_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n,
	const unsigned rk[4], struct dptp_err *err);
/* Shared by the implementations: torchrun's _assign_worker_ranks for group
 * rank me of n over c (role_info, node 0's MULTI_SET, own assigned_ranks
 * as [base, world, role base, role world]), and the common shutdown. */
int rdzv_common_assign_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n, unsigned rk[4],
	struct dptp_err *err);
void rdzv_common_shutdown(struct rendezvous *r);
/* out's group rank and size (me of n) and the ranks rdzv_common_assign_ranks gave. */
void rdzv_common_info_set_ranks(struct rdzv_info *out, unsigned me, unsigned n, const unsigned rk[4]);

/* Every node's dptp record ("<nproc> <pid> <host>" under keys, n of them,
 * this one me) over c: r->nodes and out->nodes, each node's first global
 * rank, checked against out's assignment. */
int rdzv_common_read_nodes(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *const *keys, unsigned n,
	unsigned me, struct rdzv_info *out, struct dptp_err *err);
/* mpirun's slots of this node: the cores (not hardware threads) this
 * process may run on, at least 1. */
unsigned rdzv_common_slots(void);

/* Python json.dumps of a string (ensure_ascii, with the quotes) into out. */
void rdzv_common_json_str(const char *s, char *out, size_t len);

/* Connections of one node to the store: 3 held (the agent's one, shared by
 * its clients; the cross-node PMIx watch and queue) and, at a worker start
 * or end, 1 more while it waits for every node (the pids exchange ends
 * where the finish one starts); a node that cannot get one waits for all
 * the others. (Before: 4 held and 1-2 more, 6016 for 1024 nodes.) */
#define RDZV_FDS_PER_NODE 4
/* static: the agent keeps torch's connection (its bytes are torchrun's) and
 * dptp-run's own keys on a second one: one more */
#define RDZV_FDS_PER_NODE_STATIC (RDZV_FDS_PER_NODE + 1)
/* The store's host: raises the soft RLIMIT_NOFILE towards the hard one
 * where `nodes` nodes' connections (per_node each) need more, and
 * the hard one too where the process may (root in a container); -EMFILE
 * with one line naming the limit and the node count where that is not
 * enough. */
int rdzv_common_fd_budget(unsigned nodes, unsigned per_node, struct dptp_err *err);
/* The longest wait between a node's attempts to connect to a store that is
 * not up yet: 0.05 s + 0.1 ms per node, at most a second (as before),
 * so that the nodes together try about 10,000 times a second at most and a
 * small round is in within a tenth of a second of the store. */
double rdzv_common_retry_max(unsigned nodes);
/* DPTP_STORE_STATS=1: the store's counters (dptp_tcpstore_server_stats),
 * one line on stderr; stops the server first. */
void rdzv_common_store_stats(struct dptp_tcpstore_server *s);
/* The agent store of node 0 (or the only node) at r->bind_addr and
 * r->master_port (a free port when r->ephemeral; r->master_port is then
 * the port taken), and its end. */
int rdzv_common_store_up(struct rendezvous *r, struct dptp_err *err);
void rdzv_common_store_down(struct rendezvous *r);
/* Node 0, its ranks not yet assigned (every record keys[i] is in before
 * its node's role_info, all of which node 0 has read): the records in one
 * value under agg_key over c, "nodes\n<rec 0>\n<rec 1>..." where every
 * node is a dptp-run, else "mixed <0 or 1 per node>", then a CHECK (its
 * reply orders the value before node 0's next write on another
 * connection). One value of O(N) bytes that each node reads once, instead
 * of O(N) keys (and as many CHECKs) per node. */
int rdzv_common_publish_nodes(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *const *keys, unsigned n,
	const char *agg_key, struct dptp_err *err);
/* Node 0's table (rdzv_common_publish_nodes): r->nodes and out->nodes as
 * rdzv_common_read_nodes, or out->mixed; was_dptp (may be NULL): per node. */
int rdzv_common_read_published(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *agg_key, unsigned n,
	unsigned me, struct rdzv_info *out, bool *was_dptp, struct dptp_err *err);
/* Node 0: reads every node's role_info over c (after clearing the worker
 * keys of the last attempt when clear) and writes every node's
 * assigned_ranks. */
int rdzv_common_node0_assign(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned n, bool clear,
	struct dptp_err *err);
/* assigned_ranks' value "[base, world, role base, role world]" into v. */
struct dptp_tcpstore_buf;
int rdzv_common_parse_ranks(const struct dptp_tcpstore_buf *b, unsigned v[4], struct dptp_err *err);
/* This node's role_info value: {"role": ..., "rank": me, "local_world_size": nproc}. */
void rdzv_common_role_info_value(const struct rendezvous *r, unsigned me, char *val, size_t len);

#endif
