#include "ipc/ipcsock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

void dptp_ipcsock_name(char *buf, size_t n, int group_rank, uint64_t opid)
{
	snprintf(buf, n, "/tmp/mcastmem-socket-%d-%llx", group_rank, (unsigned long long)opid);
}

static socklen_t make_addr(struct sockaddr_un *a, const char *name)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	size_t n = strlen(name);
	if (n > sizeof(a->sun_path) - 1)
		n = sizeof(a->sun_path) - 1;
	memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: abstract namespace */
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int dptp_ipcsock_bind(struct dptp_ipcsock *s, int group_rank, uint64_t opid, struct dptp_err *err)
{
	s->fd = -1;
	s->group_rank = group_rank;
	s->opid = opid;
	dptp_ipcsock_name(s->name, sizeof(s->name), group_rank, opid);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return dptp_err_set(err, -errno, "socket(AF_UNIX): %s", strerror(errno));
	int one = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0) {
		int e = errno;
		close(fd);
		return dptp_err_set(err, -e, "SO_PASSCRED: %s", strerror(e));
	}
	struct sockaddr_un a;
	socklen_t len = make_addr(&a, s->name);
	if (bind(fd, (struct sockaddr *)&a, len) < 0) {
		int e = errno;
		close(fd);
		if (e == EADDRINUSE)
			return dptp_err_set(err, -EADDRINUSE,
				"bind '@%s': address already in use: another process holds this IPC socket name", s->name);
		return dptp_err_set(err, -e, "bind '@%s': %s", s->name, strerror(e));
	}
	s->fd = fd;
	return 0;
}

void dptp_ipcsock_close(struct dptp_ipcsock *s)
{
	if (s && s->fd >= 0) {
		close(s->fd);
		s->fd = -1;
	}
}

int dptp_ipcsock_send(struct dptp_ipcsock *s, int peer_group_rank, int fd,
		      const struct dptp_ipc_msg *msg, double deadline, struct dptp_err *err)
{
	char peer[108];
	dptp_ipcsock_name(peer, sizeof(peer), peer_group_rank, s->opid);
	struct sockaddr_un a;
	socklen_t alen = make_addr(&a, peer);
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = sizeof(*msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr mh = {
		.msg_name = &a, .msg_namelen = alen,
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
	};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	c = CMSG_NXTHDR(&mh, c);
	struct ucred cr = { .pid = getpid(), .uid = getuid(), .gid = getgid() };
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_CREDENTIALS;
	c->cmsg_len = CMSG_LEN(sizeof(cr));
	memcpy(CMSG_DATA(c), &cr, sizeof(cr));
	ssize_t n;
	for (;;) {
		n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n >= 0 || (errno != EINTR && errno != EAGAIN))
			break;
		if (errno == EAGAIN) {
			/* the receiver's queue is full: wait for it to read */
			if (dptp_now() >= deadline)
				return dptp_err_set(err, -ETIMEDOUT,
					"sendmsg to '@%s': its queue stayed full until the deadline "
					"(its owner is not reading: a foreign datagram there, or a stopped peer)", peer);
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
		}
	}
	if (n < 0)
		return dptp_err_set(err, -errno, "sendmsg to '@%s': %s", peer, strerror(errno));
	return 0;
}

int dptp_ipcsock_recv(struct dptp_ipcsock *s, int *fd, struct dptp_ipc_msg *msg, pid_t *pid,
		      uid_t *uid, double timeout, struct dptp_err *err)
{
	*fd = -1;
	struct pollfd p = { .fd = s->fd, .events = POLLIN };
	int ms = timeout <= 0 ? 0 : (int)(timeout * 1000 + 0.5);
	int pr;
	do
		pr = poll(&p, 1, ms);
	while (pr < 0 && errno == EINTR);
	if (pr == 0)
		return dptp_err_set(err, -EAGAIN, "nothing arrived on '@%s'", s->name);
	if (pr < 0)
		return dptp_err_set(err, -errno, "poll '@%s': %s", s->name, strerror(errno));
	struct iovec iov = { .iov_base = msg, .iov_len = sizeof(*msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
	};
	memset(msg, 0, sizeof(*msg));
	ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return dptp_err_set(err, -errno, "recvmsg on '@%s': %s", s->name, strerror(errno));
	*pid = 0;
	*uid = (uid_t)-1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_RIGHTS) {
			size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[4];
			memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
			for (size_t i = 0; i < nfd; i++) {
				if (*fd < 0)
					*fd = fds[i];
				else
					close(fds[i]); /* more than asked for */
			}
		} else if (c->cmsg_type == SCM_CREDENTIALS) {
			struct ucred cr;
			memcpy(&cr, CMSG_DATA(c), sizeof(cr));
			*pid = cr.pid;
			*uid = cr.uid;
		}
	}
	if ((size_t)n != sizeof(*msg) || msg->magic != DPTP_IPC_MAGIC || (mh.msg_flags & MSG_CTRUNC)) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return dptp_err_set(err, -EPROTO, "malformed datagram on '@%s' from pid %ld", s->name, (long)*pid);
	}
	return 0;
}
