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

#include <pthread.h>
#include <stdbool.h>
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

/* Datagrams a socket's admit() refused (senders outside the job): dropped,
 * counted, the last sender kept for the report. Shared by a job's sockets;
 * updated with atomics (the draining thread of dptp_fd_ring() writes too). */
struct dptp_ipc_foreign {
	unsigned long count;
	pid_t pid;
	uid_t uid;
};

struct dptp_ipc_dgram {
	int fd;              /* -1 when none came with it */
	pid_t pid;           /* kernel-checked sender */
	uid_t uid;
	bool malformed;      /* wrong size or magic, or control data cut */
	struct dptp_ipc_msg msg;
};

#define DPTP_IPC_STASH 32

/* dptp_ipcsock_bind() initialises every field; an unbound socket must be
 * zeroed (fd = -1) before close or recv. */
struct dptp_ipcsock {
	int fd;
	int group_rank;
	uint64_t opid;
	char name[108];  /* printable name, without the leading NUL */
	/* who may send, set by the owner: a datagram admit() refuses is dropped
	 * and counted in *foreign. NULL admits every sender. */
	bool (*admit)(const void *ctx, pid_t pid, uid_t uid);
	const void *admit_ctx;
	struct dptp_ipc_foreign *foreign;   /* may be NULL */
	/* admitted datagrams already taken off the kernel queue, oldest first */
	pthread_mutex_t lock;
	int nstash;
	struct dptp_ipc_dgram stash[DPTP_IPC_STASH];
};

/* Formats the name (without the abstract-namespace NUL). */
void dptp_ipcsock_name(char *buf, size_t n, int group_rank, uint64_t opid);

/* Binds a socket under name(group_rank, opid). A name another process holds
 * is -EADDRINUSE with a message naming it, never a crash. */
int dptp_ipcsock_bind(struct dptp_ipcsock *s, int group_rank, uint64_t opid, struct dptp_err *err);
/* Closes the socket and any stashed descriptors. */
void dptp_ipcsock_close(struct dptp_ipcsock *s);

/* Who holds the abstract name `name` (from /proc/net/unix and /proc/<pid>/fd):
 * 0 with *pid and *uid, or -ENOENT when no visible process holds it. */
int dptp_ipcsock_holder(const char *name, pid_t *pid, uid_t *uid);

/* Sends fd with msg to the socket named (peer_group_rank, s->opid), never
 * blocking: while the peer's queue is full (a neighbour may fill it) it
 * drains its own queue and retries until `deadline` (dptp_now() time), then
 * -ETIMEDOUT naming the peer. */
int dptp_ipcsock_send(struct dptp_ipcsock *s, int peer_group_rank, int fd,
		      const struct dptp_ipc_msg *msg, double deadline, struct dptp_err *err);
/* Moves every queued datagram off the kernel queue: admitted ones to the
 * stash (while it has room), refused ones closed and counted. Thread-safe. */
void dptp_ipcsock_pump(struct dptp_ipcsock *s);
/* Receives one admitted datagram: *fd (caller closes; -1 if none came with
 * it), the payload and the kernel-checked sender pid/uid. Waits at most
 * timeout seconds (0: only what is already queued). -EAGAIN when nothing
 * came; -EPROTO for a malformed datagram from an admitted sender. */
int dptp_ipcsock_recv(struct dptp_ipcsock *s, int *fd, struct dptp_ipc_msg *msg, pid_t *pid,
		      uid_t *uid, double timeout, struct dptp_err *err);

#endif
