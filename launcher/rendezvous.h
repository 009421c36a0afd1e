/* Rendezvous: which ranks this node's workers get and where the job's store
 * lives (reference/TORCHRUN.md section E).
 *
 * The agent store. Node 0 (or the only node) hosts a TCPStore-compatible
 * server (lib/tcpstore, in its own thread) and the workers get
 * TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun:
 *  - --standalone: on a free port, a fresh one on every attempt, bound to
 *    MASTER_ADDR: --local-addr, else socket.getfqdn() (host_fqdn()).
 *  - static, one node: bound to --master-addr's address at --master-port
 *    (torchrun binds "::"; binding the given address keeps a default
 *    127.0.0.1 job off the network). --master-port=0 takes a free port. The
 *    server is destroyed and recreated at the same port on every restart:
 *    no key of a failed attempt survives (the stale-key hazard of E).
 *  - static, several nodes: node 0's store lives for the whole job (other
 *    nodes stay connected); on a restart node 0 deletes every worker key
 *    (all but init/ and <run_id>/torchelastic|dptp/) before it assigns ranks.
 *
 * Multi-node static, one agent connection per node that sends exactly
 * torchrun's bytes (ADD init/, role_info SET, node 0's MULTI_GET and
 * MULTI_SET of assigned_ranks, WAIT+GET of its own assigned_ranks, the
 * terminal_state exit barrier), plus a second "ext" connection for dptp-run's
 * own keys under /<run_id>/dptp/: each dptp-run node publishes
 * dptp/<attempt>/node/<k> = "<nproc> <pid> <hostname>" before its role_info,
 * so once its assigned_ranks arrived a node knows for certain whether every
 * node is a dptp-run (then the PMIx namespace spans the job and fences cross
 * nodes over the store) or some are torchrun (then workers get no PMIx
 * server: dptp-check uses the torchrun environment instead). */
#ifndef DPTP_LAUNCHER_RENDEZVOUS_H
#define DPTP_LAUNCHER_RENDEZVOUS_H

#include <stdbool.h>

#include "args.h"

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
	unsigned slots; /* cores its workers may use (rdzv_slots) */
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

/* Picks the implementation for o (static single node, --standalone, c10d
 * on one node, static multi-node). Borrows o. */
int rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err);

/* c10d with several nodes or MIN:MAX (rdzv_c10d.c). */
int rdzv_c10d_init(struct rendezvous *r, struct dptp_err *err);
/* c10d, from the launcher's loop while workers run: sends the heartbeat
 * when due and returns how many nodes wait for the next round (torch's
 * num_nodes_waiting(); > 0 means re-rendezvous), 0 for other backends, or a
 * negative errno. */
int rendezvous_tick(struct rendezvous *r, struct dptp_err *err);
/* c10d: the heartbeat alone, when due (0 for other backends). */
int rendezvous_heartbeat(struct rendezvous *r, struct dptp_err *err);

/* assigned_ranks rk of group rank me of n: within the bounds above, and
 * equal to torchrun's assignment computed again from every node's role_info
 * read over c (not the agent connection, whose bytes are torchrun's), which
 * must all be there (node 0 assigned from them), this node's own being its
 * command line. */
int rdzv_check_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n,
	const unsigned rk[4], struct dptp_err *err);
/* Shared by the implementations: torchrun's _assign_worker_ranks for group
 * rank me of n over c (role_info, node 0's MULTI_SET, own assigned_ranks
 * as [base, world, role base, role world]), and the common shutdown. */
int rdzv_assign_ranks(struct rendezvous *r, struct dptp_tcpstore_client *c, unsigned me, unsigned n, unsigned rk[4],
	struct dptp_err *err);
void rdzv_common_shutdown(struct rendezvous *r);
/* out's group rank and size (me of n) and the ranks rdzv_assign_ranks gave. */
void rdzv_info_set_ranks(struct rdzv_info *out, unsigned me, unsigned n, const unsigned rk[4]);

/* Multi-node, after every local worker exited 0: torchrun's exit barrier
 * (terminal_state num_members / last_member, at most timeout s). Returns 0
 * when every node arrived, 1 when another dptp-run node reported a failed
 * attempt meanwhile, or a negative errno (timeout included). */
int rendezvous_exit_barrier(struct rendezvous *r, double timeout, struct dptp_err *err);
/* Multi-node: tells the other dptp-run nodes this attempt failed (they stop
 * their workers). */
void rendezvous_report_failure(struct rendezvous *r);

/* Every node's dptp record ("<nproc> <pid> <host>" under keys, n of them,
 * this one me) over c: r->nodes and out->nodes, each node's first global
 * rank, checked against out's assignment. */
int rdzv_read_nodes(struct rendezvous *r, struct dptp_tcpstore_client *c, const char *const *keys, unsigned n,
	unsigned me, struct rdzv_info *out, struct dptp_err *err);
/* The name this node goes by in the job: DPTP_HOSTNAME when set (several
 * nodes laid over one machine), else gethostname(). */
void rdzv_hostname(char *buf, size_t len);
/* mpirun's slots of this node: the cores (not hardware threads) this
 * process may run on, at least 1. */
unsigned rdzv_slots(void);

/* Python json.dumps of a string (ensure_ascii, with the quotes) into out. */
void rdzv_json_str(const char *s, char *out, size_t len);

#endif
