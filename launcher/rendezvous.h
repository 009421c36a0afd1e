/* Rendezvous: which ranks this node's workers get and where the job's store
 * lives. Only the static single-node case is implemented; the multi-node
 * static rendezvous with its TCPStore server plugs in behind the same ops. */
#ifndef DPTP_LAUNCHER_RENDEZVOUS_H
#define DPTP_LAUNCHER_RENDEZVOUS_H

#include <stdbool.h>

#include "args.h"

struct rdzv_info {
	unsigned group_rank, group_world_size;
	unsigned base_global_rank, global_world_size;
	unsigned base_role_rank, role_world_size;
	char master_addr[256];
	unsigned master_port;
	char run_id[64];
	/* TORCHELASTIC_USE_AGENT_STORE: true only when this launcher (or node
	 * 0's) hosts a TCPStore at master_addr:master_port for the workers. */
	bool use_agent_store;
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
};

/* Picks the implementation for o (static single node, --standalone, or c10d
 * on one node). Borrows o. */
int rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err);

/* socket.getfqdn(): the canonical name when it has a dot, else the host name. */
void rdzv_fqdn(char *buf, size_t len);

#endif
