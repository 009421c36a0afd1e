/* PMIx fences across nodes, carried over node 0's store from the launcher's
 * poll loop (never from PMIx's progress thread, never blocking it).
 *
 * When every local participant of a fence has arrived, the node's server
 * SETs its collected blob under <prefix>fence/<sig>.<seq>/blob/<node> and
 * ADDs 1 to .../count; the node whose ADD reaches the number of nodes that
 * host participants SETs .../done; every such node WAITs on done, MULTI_GETs
 * the blobs (node order) and completes its local fence with their
 * concatenation (OpenPMIx's servers accept several servers' blobs back to
 * back, as PRRTE's allgather delivers them). <prefix> is per run and per
 * attempt; <sig> is "all" for the whole job, else a hash of the sorted
 * ranks, and <seq> counts the fences of that signature: fences over subsets
 * work, including subsets that span nodes. Each fence has its own non-blocking
 * connection; a fence that does not complete within the timeout fails.
 *
 * Direct modex (a client's PMIx_Get of a remote rank with no fence before
 * it): the asking node QUEUE_PUSHes "<node> <id> <rank>" onto
 * <prefix>dmodex/<owner>/queue and WAITs for <prefix>dmodex/<node>/answer/<id>;
 * every node keeps a WAIT on its own queue, pops requests, asks its PMIx
 * server (PMIx_server_dmodex_request) and SETs the answer (a status byte,
 * then the blob).
 *
 * The same object watches <prefix>failed: another node reporting a failed
 * attempt ends this node's attempt too; and the other nodes' liveness:
 * heartbeats as counters under <prefix>hb/<node>, on a connection of their
 * own, so that a node whose launcher died (SIGKILL, a lost host) is noticed
 * within a bounded time; and the store's own liveness (static and c10d): a
 * connection to it that breaks, or a rendezvous request it leaves unanswered
 * (xnode_store_doubt), puts it in doubt; a fresh connection every probe
 * interval then either gets its PING answered (however late: a loaded
 * store's host answers late) and the doubt ends, or the store is gone
 * (xnode_store_gone) once refused or broken for gone_after s in a row, or
 * unanswered for silent_after s. */
#ifndef DPTP_LAUNCHER_XNODE_H
#define DPTP_LAUNCHER_XNODE_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "pmix/pmix_srv.h"
#include "rdzv/rendezvous.h"

#define XNODE_MAX_FDS 64
/* nodes whose heartbeats each node watches: the next ones in a ring */
#define XNODE_HB_WATCH 2

struct xnode;

/* Connects the failure watch. Borrows nodes for the object's lifetime.
 * hb_interval > 0: heartbeats every hb_interval s, a node silent for
 * hb_timeout s is lost (xnode_lost). */
int xnode_start(struct xnode **out, const char *host, unsigned port, const char *prefix,
	const struct rdzv_node *nodes, unsigned nnodes, unsigned me, double timeout, double hb_interval,
	double hb_timeout, struct pmix_srv *srv, struct dptp_err *err);
/* The node found lost (its reason in *why), or -1. Once every node's
 * workers are done (xnode_finish), silence is no loss. */
int xnode_lost(const struct xnode *x, const char **why);
/* Probes every probe_iv s while the store is in doubt; it is gone after
 * gone_after s of refused or broken connections, or silent_after s (at
 * least gone_after) of silence. xnode_start's defaults: hb_interval,
 * hb_timeout, hb_timeout (no probe with hb_interval 0). */
void xnode_store_bounds(struct xnode *x, double probe_iv, double gone_after, double silent_after);
/* A store request failed (why), the store silent since since (a
 * monotonic dptp_now() time): in doubt from then on, unless it already is. */
void xnode_store_doubt(struct xnode *x, const char *why, double since);
/* Why the store is gone ("connection refused since 3 s"), or NULL. */
const char *xnode_store_gone(const struct xnode *x);
/* timeout, or less when the next heartbeat, probe or verdict is due sooner. */
double xnode_poll_timeout(const struct xnode *x, double timeout);
/* Fails every pending fence and closes every connection; NULL is fine. */
void xnode_stop(struct xnode *x);
/* Takes f: completes it now (participants all local) or after the exchange. */
void xnode_fence(struct xnode *x, struct pmix_srv_fence *f);
/* Takes d: fetches a remote rank's data from its node. */
void xnode_dmodex(struct xnode *x, struct pmix_srv_dmodex *d);
/* A job-wide PMIx event (pmix_srv sink blob): QUEUE_PUSHed, marked 'E',
 * onto every other node's direct-modex queue, whose server delivers it to
 * its workers (pmix_srv_notify_local). */
void xnode_notify(struct xnode *x, const void *blob, size_t len);
/* This server's answer to a request xnode popped (token from it). */
void xnode_dmodex_answer(struct xnode *x, void *token, bool found, const void *data, size_t len);
/* This node's workers' pids (n, rank order), for the other nodes' proc
 * tables; the other nodes' come back into the server as they publish
 * (pmix_srv_remote_pid). */
void xnode_publish_pids(struct xnode *x, const pid_t *pids, unsigned n);
/* This node's workers all exited 0: ADDs <prefix>workers_done/count; the
 * last node SETs .../all. Until xnode_finished(), the loop keeps serving
 * direct-modex requests for the other nodes (their workers may still read
 * ours). A failed or timed-out wait counts as finished (logged). */
void xnode_finish(struct xnode *x, double timeout);
bool xnode_finished(const struct xnode *x);
/* Fills at most max pollfds; returns how many. */
size_t xnode_pollfds(struct xnode *x, struct pollfd *pfd, size_t max);
/* Handles the pollfds xnode_pollfds gave (same order) and the deadlines.
 * Returns the node that reported a failed attempt, or -1. */
int xnode_handle(struct xnode *x, const struct pollfd *pfd, size_t n);
/* Fences exchanged over the store so far (for timing and tests). */
unsigned long xnode_count(const struct xnode *x);

#endif
