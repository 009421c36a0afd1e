/* Rendezvous: which ranks this node's workers get and where the job's store
 * lives (reference/TORCHRUN.md section E).
 *
 * The agent store. Node 0 (or the only node) hosts a TCPStore-compatible
 * server (lib/wire/tcpstore_server.c, in its own thread) and the workers get
 * TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun:
 *  - --standalone: on a free port, a fresh one on every attempt, bound to
 *    MASTER_ADDR: --local-addr, else socket.getfqdn() (dptp_getfqdn()).
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

#include "rdzv/rdzv_common.h"

/* Picks the implementation for o (static single node, --standalone, c10d
 * on one node, static multi-node). Borrows o. */
int rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err);

/* c10d, from the launcher's loop while workers run: sends the heartbeat
 * when due and returns how many nodes wait for the next round (torch's
 * num_nodes_waiting(); > 0 means re-rendezvous), 0 for other backends, or a
 * negative errno. */
int rendezvous_tick(struct rendezvous *r, struct dptp_err *err);
/* c10d: the heartbeat alone, when due (0 for other backends). */
int rendezvous_heartbeat(struct rendezvous *r, struct dptp_err *err);

/* Multi-node, after every local worker exited 0: torchrun's exit barrier
 * (terminal_state num_members / last_member, at most timeout s). Returns 0
 * when every node arrived, 1 when another dptp-run node reported a failed
 * attempt meanwhile, or a negative errno (timeout included). */
int rendezvous_exit_barrier(struct rendezvous *r, double timeout, struct dptp_err *err);
/* Multi-node: tells the other dptp-run nodes this attempt failed (they stop
 * their workers). */
void rendezvous_report_failure(struct rendezvous *r);
/* After a completed rendezvous, this node cannot go on (its setup failed:
 * the cross-node link, the PMIx registration, a worker's start): tells the
 * other dptp-run nodes, static or c10d (the round's dptp/failed, which
 * their cross-node link watches), so that they stop now rather than wait
 * for this node until their timeouts (2048 c10d agents on 2 cores: the
 * others waited 300 s in the finish exchange). */
void rendezvous_report_error(struct rendezvous *r);

#endif
