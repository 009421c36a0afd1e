/* The rendezvous (launcher/rdzv/rendezvous.c, rdzv_common.c) with real
 * stores (lib/wire's TCPStore server, hosted by node 0 as under dptp-run)
 * and the nodes of a job as threads of this process: which ranks a node's
 * workers get, and what a restart keeps.
 *
 * - static, one node: group rank 0 of 1, ranks 0..nproc-1, an agent store
 *   whose keys do not survive into the next attempt;
 * - static, two nodes with different --nproc-per-node (2 and 3): group rank
 *   = --node-rank, node 1's first rank 2 of 5 (torchrun's
 *   _assign_worker_ranks: the nodes before it, in group-rank order), both
 *   dptp-run, so a node table and one nspace; the same again on a restart,
 *   under the restart's own key prefix;
 * - c10d, two nodes (2 and 3): group ranks 0 and 1 in some order, and the
 *   worker ranks follow that order as torchrun's do;
 * - assigned_ranks read from the store only in torchrun's exact form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/util.h"
#include "rdzv/rendezvous.h"
#include "wire/tcpstore.h"

/* a loopback port free a moment ago */
static unsigned free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

struct node {
	char *argv[16];
	char buf[16][96];
	int argc;
	struct run_opts o;
	struct rendezvous r;
	struct rdzv_info info;
	unsigned restart;
	int rc;
	struct dptp_err err;
};

static void node_args(struct node *n, const char *const *args)
{
	n->argc = 0;
	n->argv[n->argc++] = "dptp-run";
	for (; *args; args++) {
		snprintf(n->buf[n->argc], sizeof(n->buf[0]), "%s", *args);
		n->argv[n->argc] = n->buf[n->argc];
		n->argc++;
	}
	n->argv[n->argc] = NULL;
	FILE *sink = fopen("/dev/null", "w");
	assert_non_null(sink);
	assert_int_equal(run_opts_parse(&n->o, n->argc, n->argv, sink, sink), RUN_OPTS_OK);
	fclose(sink);
	memset(&n->err, 0, sizeof(n->err));
	assert_int_equal(rendezvous_init(&n->r, &n->o, &n->err), 0);
}

static void *node_next(void *arg)
{
	struct node *n = arg;
	n->rc = n->r.ops->next(&n->r, n->restart, &n->info, &n->err);
	return NULL;
}

/* every node's next(restart) at once, as separate launchers would */
static void round_of(struct node *nodes, size_t k, unsigned restart)
{
	pthread_t t[4];
	for (size_t i = 0; i < k; i++) {
		nodes[i].restart = restart;
		assert_int_equal(pthread_create(&t[i], NULL, node_next, &nodes[i]), 0);
	}
	for (size_t i = 0; i < k; i++)
		pthread_join(t[i], NULL);
	for (size_t i = 0; i < k; i++)
		if (nodes[i].rc < 0)
			fail_msg("node %zu: %s", i, nodes[i].err.msg);
}

/* the nodes end in reverse: node 0's store last */
static void end_nodes(struct node *nodes, size_t k)
{
	for (size_t i = k; i-- > 0;) {
		nodes[i].r.ops->shutdown(&nodes[i].r);
		run_opts_release(&nodes[i].o);
	}
}

static struct dptp_tcpstore_client *connect_to(const struct rdzv_info *in)
{
	struct dptp_tcpstore_client_opts co = {.host = in->master_addr, .port = (uint16_t)in->master_port, .timeout = 10};
	struct dptp_tcpstore_client *c = NULL;
	struct dptp_err e = {0};
	if (dptp_tcpstore_client_create(&co, &c, &e) < 0)
		fail_msg("store %s:%u: %s", in->master_addr, in->master_port, e.msg);
	return c;
}

static void test_static_one_node(void **state)
{
	(void)state;
	struct node n;
	const char *args[] = {"--nproc-per-node=3", "--master-port=0", "--rdzv-conf=timeout=20", "--no-python",
		"/bin/true", NULL};
	struct dptp_err e = {0};
	bool ready = true;
	const char *key[] = {"stale"};
	node_args(&n, args);
	round_of(&n, 1, 0);
	assert_int_equal(n.info.group_rank, 0);
	assert_int_equal(n.info.group_world_size, 1);
	assert_int_equal(n.info.base_global_rank, 0);
	assert_int_equal(n.info.global_world_size, 3);
	assert_true(n.info.use_agent_store);
	assert_true(n.info.master_port > 0);
	assert_null(n.info.nodes);
	assert_string_equal(n.info.dptp_prefix, "/none/dptp/0/");
	struct dptp_tcpstore_client *c = connect_to(&n.info);
	assert_int_equal(dptp_tcpstore_client_set(c, "stale", "1", 1, &e), 0);
	assert_int_equal(dptp_tcpstore_client_check(c, key, 1, &ready, &e), 0);
	assert_true(ready);
	dptp_tcpstore_client_destroy(c);
	/* a restart: a fresh store, without the failed attempt's keys */
	round_of(&n, 1, 1);
	assert_int_equal(n.info.global_world_size, 3);
	assert_string_equal(n.info.dptp_prefix, "/none/dptp/1/");
	c = connect_to(&n.info);
	assert_int_equal(dptp_tcpstore_client_check(c, key, 1, &ready, &e), 0);
	assert_false(ready);
	dptp_tcpstore_client_destroy(c);
	end_nodes(&n, 1);
}

static void test_static_two_nodes(void **state)
{
	(void)state;
	struct node nd[2];
	char port[32];
	snprintf(port, sizeof(port), "--master-port=%u", free_port());
	const char *a0[] = {"--nnodes=2", "--node-rank=0", "--nproc-per-node=2", port, "--rdzv-conf=timeout=20",
		"--no-python", "/bin/true", NULL};
	const char *a1[] = {"--nnodes=2", "--node-rank=1", "--nproc-per-node=3", port, "--rdzv-conf=timeout=20",
		"--no-python", "/bin/true", NULL};
	node_args(&nd[0], a0);
	node_args(&nd[1], a1);
	for (unsigned restart = 0; restart < 2; restart++) {
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "/none/dptp/%u/", restart);
		round_of(nd, 2, restart);
		for (unsigned k = 0; k < 2; k++) {
			const struct rdzv_info *in = &nd[k].info;
			assert_int_equal(in->group_rank, k);
			assert_int_equal(in->group_world_size, 2);
			assert_int_equal(in->global_world_size, 5);
			assert_int_equal(in->role_world_size, 5);
			assert_int_equal(in->base_global_rank, k ? 2 : 0);
			assert_int_equal(in->base_role_rank, k ? 2 : 0);
			assert_false(in->mixed);
			assert_non_null(in->nodes);
			assert_int_equal(in->nodes[0].nproc, 2);
			assert_int_equal(in->nodes[0].base, 0);
			assert_int_equal(in->nodes[1].nproc, 3);
			assert_int_equal(in->nodes[1].base, 2);
			assert_int_equal(in->nodes[k].pid, (int)getpid());
			assert_string_equal(in->dptp_prefix, prefix);
		}
		assert_string_equal(nd[0].info.nspace, nd[1].info.nspace);
		assert_int_equal(nd[1].info.store_port, nd[0].info.store_port);
	}
	end_nodes(nd, 2);
}

static void test_c10d_two_nodes(void **state)
{
	(void)state;
	struct node nd[2];
	char ep[64];
	snprintf(ep, sizeof(ep), "--rdzv-endpoint=127.0.0.1:%u", free_port());
	/* two launchers of one process: --local-addr tells them apart (torch's
	 * node descriptor is address, pid and a local id) */
	const char *a0[] = {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-id=u26", "--nproc-per-node=2", ep, "--local-addr=127.0.0.1",
		"--rdzv-conf=timeout=20,join_timeout=20", "--no-python", "/bin/true", NULL};
	const char *a1[] = {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-id=u26", "--nproc-per-node=3", ep, "--local-addr=localhost",
		"--rdzv-conf=timeout=20,join_timeout=20", "--no-python", "/bin/true", NULL};
	node_args(&nd[0], a0);
	node_args(&nd[1], a1);
	round_of(nd, 2, 0);
	/* group ranks 0 and 1, one each; the worker ranks follow them */
	assert_int_equal(nd[0].info.group_rank + nd[1].info.group_rank, 1);
	const struct node *first = nd[0].info.group_rank == 0 ? &nd[0] : &nd[1];
	const struct node *second = first == &nd[0] ? &nd[1] : &nd[0];
	assert_int_equal(first->info.base_global_rank, 0);
	assert_int_equal(second->info.base_global_rank, first->o.nproc);
	for (unsigned k = 0; k < 2; k++) {
		assert_int_equal(nd[k].info.group_world_size, 2);
		assert_int_equal(nd[k].info.global_world_size, 5);
		assert_non_null(nd[k].info.nodes);
		assert_int_equal(nd[k].info.nodes[second->info.group_rank].base, first->o.nproc);
	}
	assert_string_equal(nd[0].info.nspace, nd[1].info.nspace);
	/* the store's host (whose endpoint it is) shuts down last */
	size_t last = nd[1].r.server && !nd[0].r.server ? 1 : 0;
	for (size_t i = 0; i < 2; i++) {
		struct node *n = &nd[i == 0 ? 1 - last : last];
		n->r.ops->shutdown(&n->r);
		run_opts_release(&n->o);
	}
}

/* assigned_ranks as torchrun's node 0 writes it (json.dumps of a list),
 * and nothing else: a store's value is not trusted */
static void test_parse_ranks(void **state)
{
	(void)state;
	static const char *const bad[] = {"[2,5,2,5]", "[2, 5, 2]", "[2, 5, 2, 5] ", "[-1, 5, 2, 5]",
		"[4294967296, 5, 2, 5]", "[2, 5, 2, 5, 6]", "(2, 5, 2, 5)", "", "[2, 5, 2, x]"};
	unsigned v[4];
	struct dptp_err e = {0};
	char ok[] = "[2, 5, 0, 3]";
	struct dptp_tcpstore_buf b = {.data = (uint8_t *)ok, .len = sizeof(ok) - 1};
	assert_int_equal(rdzv_common_parse_ranks(&b, v, &e), 0);
	assert_int_equal(v[0], 2);
	assert_int_equal(v[1], 5);
	assert_int_equal(v[2], 0);
	assert_int_equal(v[3], 3);
	for (size_t i = 0; i < DPTP_ARRAY_LEN(bad); i++) {
		char buf[64];
		snprintf(buf, sizeof(buf), "%s", bad[i]);
		b = (struct dptp_tcpstore_buf){.data = (uint8_t *)buf, .len = strlen(buf)};
		if (rdzv_common_parse_ranks(&b, v, &e) != -EPROTO)
			fail_msg("'%s' taken", bad[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_static_one_node),
		cmocka_unit_test(test_static_two_nodes),
		cmocka_unit_test(test_c10d_two_nodes),
		cmocka_unit_test(test_parse_ranks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
