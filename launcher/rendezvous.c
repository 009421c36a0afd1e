/* Static single-node rendezvous (see rendezvous.h). */
#include "rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void rdzv_fqdn(char *buf, size_t len)
{
	struct addrinfo hints = {.ai_flags = AI_CANONNAME}, *res = NULL;
	char host[256] = "localhost";
	gethostname(host, sizeof(host) - 1);
	snprintf(buf, len, "%s", host);
	if (getaddrinfo(host, NULL, &hints, &res) == 0) {
		if (res && res->ai_canonname && strchr(res->ai_canonname, '.'))
			snprintf(buf, len, "%s", res->ai_canonname);
		freeaddrinfo(res);
	}
}

static int free_port(unsigned *port, struct dptp_err *err)
{
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};
	socklen_t alen = sizeof(a);
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		struct sockaddr_in a4 = {.sin_family = AF_INET};
		socklen_t a4len = sizeof(a4);
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || bind(fd, (struct sockaddr *)&a4, sizeof(a4)) < 0 ||
		    getsockname(fd, (struct sockaddr *)&a4, &a4len) < 0)
			goto fail;
		*port = ntohs(a4.sin_port);
		close(fd);
		return 0;
	}
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &alen) < 0)
		goto fail;
	*port = ntohs(a.sin6_port);
	close(fd);
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return dptp_err_set(err, -errno, "cannot find a free port: %s", strerror(errno));
}

static void uuid4(char *out, size_t len)
{
	unsigned char b[16] = {0};
	dptp_entropy(b, sizeof(b));
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, len, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int static_next(struct rendezvous *r, unsigned restart_count, struct rdzv_info *out, struct dptp_err *err)
{
	const struct run_opts *o = r->opts;
	(void)restart_count;
	memset(out, 0, sizeof(*out));
	out->group_rank = o->node_rank;
	out->group_world_size = o->max_nodes;
	out->base_global_rank = 0;
	out->global_world_size = o->nproc * o->max_nodes;
	out->base_role_rank = out->base_global_rank;
	out->role_world_size = out->global_world_size;
	snprintf(out->master_addr, sizeof(out->master_addr), "%s", r->master_addr);
	out->master_port = r->master_port;
	snprintf(out->run_id, sizeof(out->run_id), "%s", r->run_id);
	/* No agent store yet (the TCPStore server is the torchrun-interop
	 * issue): with "False", PyTorch's rank 0 hosts the store itself at
	 * MASTER_PORT, so env:// still works. */
	out->use_agent_store = false;
	return 0;
}

static void static_shutdown(struct rendezvous *r)
{
	(void)r;
}

static const struct rendezvous_ops static_ops = {
	.next = static_next,
	.shutdown = static_shutdown,
};

int rendezvous_init(struct rendezvous *r, const struct run_opts *o, struct dptp_err *err)
{
	memset(r, 0, sizeof(*r));
	r->ops = &static_ops;
	r->opts = o;
	if (o->standalone || strcmp(o->rdzv_backend, "static")) {
		/* torchrun: c10d at localhost:0 with a uuid4 run id for
		 * --standalone; on one node every backend reduces to this. */
		if (o->standalone)
			uuid4(r->run_id, sizeof(r->run_id));
		else
			snprintf(r->run_id, sizeof(r->run_id), "%s", o->rdzv_id);
		rdzv_fqdn(r->master_addr, sizeof(r->master_addr));
		return free_port(&r->master_port, err);
	}
	snprintf(r->run_id, sizeof(r->run_id), "%s", o->rdzv_id);
	if (o->rdzv_endpoint && *o->rdzv_endpoint) {
		int port;
		DPTP_TRY(run_parse_endpoint(o->rdzv_endpoint, r->master_addr, sizeof(r->master_addr), &port, err));
		if (port < 0)
			return dptp_err_set(err, -EINVAL, "Port number must be specified for StaticTCPRendezvous, endpoint: %s", o->rdzv_endpoint);
		r->master_port = (unsigned)port;
	} else {
		snprintf(r->master_addr, sizeof(r->master_addr), "%s", o->master_addr);
		r->master_port = o->master_port;
	}
	return 0;
}
