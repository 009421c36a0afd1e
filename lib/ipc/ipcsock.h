/* The IPC socket of the fused-allreduce workspace (bug 4's mechanism): an
 * AF_UNIX datagram socket bound in the Linux abstract namespace under
 * "/tmp/mcastmem-socket-<group rank>-<opId in lowercase hex>" (the reference
 * implementation's name); file descriptors travel over it with SCM_RIGHTS.
 *
 * Unlike the reference, every datagram carries the sender's credentials
 * (SCM_CREDENTIALS, checked by the kernel) and a payload naming its global
 * rank, so a receiver can tell a descriptor from another group. */
#ifndef DPTP_LIB_IPCSOCK_H
#define DPTP_LIB_IPCSOCK_H

#include <stdint.h>
#include <sys/types.h>

#include "base/util.h"

#define DPTP_IPC_MAGIC 0x64707470u /* "dptp" */

struct dptp_ipc_msg {
	uint32_t magic;
	int32_t global_rank;  /* sender */
	int32_t group_rank;   /* sender's rank in the exchange group, as it believes */
	int32_t buffer;       /* which workspace buffer */
	uint64_t opid;
};

struct dptp_ipcsock {
	int fd;
	int group_rank;
	uint64_t opid;
	char name[108];  /* printable name, without the leading NUL */
};

/* Formats the name (without the abstract-namespace NUL). */
void dptp_ipcsock_name(char *buf, size_t n, int group_rank, uint64_t opid);

/* Binds a socket under name(group_rank, opid). A name another process holds
 * is -EADDRINUSE with a message naming it, never a crash. */
int dptp_ipcsock_bind(struct dptp_ipcsock *s, int group_rank, uint64_t opid, struct dptp_err *err);
void dptp_ipcsock_close(struct dptp_ipcsock *s);

/* Sends fd with msg to the socket named (peer_group_rank, s->opid). A
 * receiver whose queue is full (the kernel may allow a single datagram) is
 * waited for until `deadline` (dptp_now() time), then -ETIMEDOUT naming it:
 * a foreign datagram left there, or a peer that stopped reading, never
 * blocks the sender for good. */
int dptp_ipcsock_send(struct dptp_ipcsock *s, int peer_group_rank, int fd,
		      const struct dptp_ipc_msg *msg, double deadline, struct dptp_err *err);
/* Receives one datagram: *fd (caller closes; -1 if none came with it), the
 * payload and the kernel-checked sender pid/uid. Waits at most timeout
 * seconds (0: only what is already queued). -EAGAIN when nothing came. */
int dptp_ipcsock_recv(struct dptp_ipcsock *s, int *fd, struct dptp_ipc_msg *msg, pid_t *pid,
		      uid_t *uid, double timeout, struct dptp_err *err);

#endif
