/* crec_e2e's gpu program: loads LIB (argv[1], c_gpu_user.c) with
 * RTLD_LOCAL, exports GPU memory (stand-in libcudart/libcuda), forks, and
 * the child imports it; the fd reaches the child over a socket
 * (SCM_RIGHTS), as another number. Exits 0 when every call returned 0. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
	char reserved[64];
} ipc_handle;

static int send_fd(int sock, int fd)
{
	char c = 0, ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&c, 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char c, ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {&c, 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	int fd = -1;
	if (recvmsg(sock, &m, 0) != 1 || !CMSG_FIRSTHDR(&m))
		return -1;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 2;
	}
	int (*exp)(ipc_handle *, int *, unsigned char *) =
		(int (*)(ipc_handle *, int *, unsigned char *))dlsym(lib, "gpu_export");
	int (*imp)(ipc_handle *, int, unsigned char *) = (int (*)(ipc_handle *, int, unsigned char *))dlsym(lib, "gpu_import");
	int sv[2];
	if (!exp || !imp || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
		return 2;
	pid_t pid = fork();
	if (pid == 0) {
		ipc_handle h[4];
		unsigned char fabric[64];
		close(sv[0]);
		if (read(sv[1], h, sizeof(h)) != (ssize_t)sizeof(h) || read(sv[1], fabric, 64) != 64)
			_exit(3);
		int fd = recv_fd(sv[1]);
		/* another number than the exporter's, for the same file */
		int fd2 = dup(fd);
		close(fd);
		_exit(fd2 < 0 || imp(h, fd2, fabric) ? 4 : 0);
	}
	close(sv[1]);
	ipc_handle h[4];
	unsigned char fabric[64];
	int fd = -1, st = 0;
	int rc = exp(h, &fd, fabric);
	if (rc || write(sv[0], h, sizeof(h)) != (ssize_t)sizeof(h) || write(sv[0], fabric, 64) != 64 || send_fd(sv[0], fd))
		rc = 5;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		rc = 6;
	printf("gpu calls returned %d\n", rc);
	return rc;
}
