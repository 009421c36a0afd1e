#include "ipc/ipcsock.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
	s->admit = NULL;
	s->admit_ctx = NULL;
	s->foreign = NULL;
	s->nstash = 0;
	pthread_mutex_init(&s->lock, NULL);
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
	if (!s)
		return;
	if (s->fd >= 0) {
		close(s->fd);
		s->fd = -1;
	}
	for (int i = 0; i < s->nstash; i++)
		if (s->stash[i].fd >= 0)
			close(s->stash[i].fd);
	s->nstash = 0;
}

int dptp_ipcsock_holder(const char *name, pid_t *pid, uid_t *uid)
{
	/* the socket's inode from /proc/net/unix, then who has it open */
	FILE *f = fopen("/proc/net/unix", "re");
	if (!f)
		return -ENOENT;
	char line[512], want[112];
	snprintf(want, sizeof(want), "@%s", name);
	unsigned long ino = 0;
	while (!ino && fgets(line, sizeof(line), f)) {
		char path[256] = "";
		unsigned long i;
		if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %255s", &i, path) == 2 && strcmp(path, want) == 0)
			ino = i;
	}
	fclose(f);
	if (!ino)
		return -ENOENT;
	char target[64];
	snprintf(target, sizeof(target), "socket:[%lu]", ino);
	DIR *proc = opendir("/proc");
	if (!proc)
		return -ENOENT;
	int rc = -ENOENT;
	struct dirent *d;
	while (rc < 0 && (d = readdir(proc))) {
		char *end;
		long p = strtol(d->d_name, &end, 10);
		if (*end || p <= 0)
			continue;
		char dir[64];
		snprintf(dir, sizeof(dir), "/proc/%ld/fd", p);
		DIR *fds = opendir(dir);
		if (!fds)
			continue;
		struct dirent *e;
		while (rc < 0 && (e = readdir(fds))) {
			char lp[128], t[64];
			snprintf(lp, sizeof(lp), "%s/%s", dir, e->d_name);
			ssize_t n = readlink(lp, t, sizeof(t) - 1);
			if (n <= 0)
				continue;
			t[n] = 0;
			if (strcmp(t, target) == 0) {
				struct stat st;
				snprintf(lp, sizeof(lp), "/proc/%ld", p);
				*pid = (pid_t)p;
				*uid = stat(lp, &st) == 0 ? st.st_uid : (uid_t)-1;
				rc = 0;
			}
		}
		closedir(fds);
	}
	closedir(proc);
	return rc;
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
	for (unsigned tries = 0;; tries++) {
		if (sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return dptp_err_set(err, -errno, "sendmsg to '@%s': %s", peer, strerror(errno));
		if (dptp_now() > deadline)
			return dptp_err_set(err, -ETIMEDOUT,
				"sendmsg to '@%s': its queue stayed full until the deadline (%u tries)", peer, tries + 1);
		/* the peer drains its queue as we drain ours */
		dptp_ipcsock_pump(s);
		struct timespec ts = { 0, tries < 100 ? 100000 : 1000000 };
		nanosleep(&ts, NULL);
	}
}

/* One datagram off the kernel queue, without waiting: 0, -EAGAIN or -errno. */
static int take(struct dptp_ipcsock *s, struct dptp_ipc_dgram *d)
{
	d->fd = -1;
	d->pid = 0;
	d->uid = (uid_t)-1;
	d->malformed = false;
	memset(&d->msg, 0, sizeof(d->msg));
	struct iovec iov = { .iov_base = &d->msg, .iov_len = sizeof(d->msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
	};
	ssize_t n;
	do
		n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_RIGHTS) {
			size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[4];
			if (nfd > 4)
				nfd = 4;
			memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
			for (size_t i = 0; i < nfd; i++) {
				if (d->fd < 0)
					d->fd = fds[i];
				else
					close(fds[i]); /* more than asked for */
			}
		} else if (c->cmsg_type == SCM_CREDENTIALS) {
			struct ucred cr;
			memcpy(&cr, CMSG_DATA(c), sizeof(cr));
			d->pid = cr.pid;
			d->uid = cr.uid;
		}
	}
	d->malformed = (size_t)n != sizeof(d->msg) || d->msg.magic != DPTP_IPC_MAGIC || (mh.msg_flags & MSG_CTRUNC);
	return 0;
}

void dptp_ipcsock_pump(struct dptp_ipcsock *s)
{
	if (s->fd < 0)
		return;
	pthread_mutex_lock(&s->lock);
	while (s->nstash < DPTP_IPC_STASH) {
		struct dptp_ipc_dgram d;
		if (take(s, &d) < 0)
			break;
		if (s->admit && !s->admit(s->admit_ctx, d.pid, d.uid)) {
			if (d.fd >= 0)
				close(d.fd);
			if (s->foreign) {
				__atomic_store_n(&s->foreign->pid, d.pid, __ATOMIC_RELAXED);
				__atomic_store_n(&s->foreign->uid, d.uid, __ATOMIC_RELAXED);
				__atomic_add_fetch(&s->foreign->count, 1, __ATOMIC_RELAXED);
			}
			continue;
		}
		s->stash[s->nstash++] = d;
	}
	pthread_mutex_unlock(&s->lock);
}

/* The oldest stashed datagram, or false. */
static bool pop(struct dptp_ipcsock *s, struct dptp_ipc_dgram *d)
{
	pthread_mutex_lock(&s->lock);
	bool got = s->nstash > 0;
	if (got) {
		*d = s->stash[0];
		memmove(&s->stash[0], &s->stash[1], (size_t)(s->nstash - 1) * sizeof(s->stash[0]));
		s->nstash--;
	}
	pthread_mutex_unlock(&s->lock);
	return got;
}

int dptp_ipcsock_recv(struct dptp_ipcsock *s, int *fd, struct dptp_ipc_msg *msg, pid_t *pid,
		      uid_t *uid, double timeout, struct dptp_err *err)
{
	*fd = -1;
	double end = dptp_now() + (timeout > 0 ? timeout : 0);
	struct dptp_ipc_dgram d;
	for (;;) {
		dptp_ipcsock_pump(s);
		if (pop(s, &d))
			break;
		double left = end - dptp_now();
		if (left <= 0)
			return dptp_err_set(err, -EAGAIN, "nothing arrived on '@%s'", s->name);
		/* short slices: a draining thread may take what poll saw */
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int ms = left > 0.01 ? 10 : (int)(left * 1000) + 1;
		if (poll(&p, 1, ms) < 0 && errno != EINTR)
			return dptp_err_set(err, -errno, "poll '@%s': %s", s->name, strerror(errno));
	}
	*msg = d.msg;
	*pid = d.pid;
	*uid = d.uid;
	if (d.malformed) {
		if (d.fd >= 0)
			close(d.fd);
		return dptp_err_set(err, -EPROTO, "malformed datagram on '@%s' from pid %ld", s->name, (long)d.pid);
	}
	*fd = d.fd;
	return 0;
}
