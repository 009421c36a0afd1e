/* The cross-node watch (launcher/pmix/xnode.c) over a real store: lib/wire's
 * TCPStore server in this process, two nodes' xnode objects driven by one
 * poll loop as two launchers' loops would drive theirs (heartbeats every
 * 0.05 s, a node silent for 0.5 s is lost).
 *
 * - both beating: neither is lost (over twice the timeout)
 * - node 1's launcher gone (its xnode stopped: no more heartbeats): node 0
 *   finds node 1 lost, "no heartbeat", not before the timeout and within
 *   the loop's bound
 * - both nodes' workers done (xnode_finish): silence is no loss then
 * - a failed attempt reported under <prefix>failed: node 0's xnode_handle
 *   says so
 * - a store in doubt (a failed request) that answers a fresh connection is
 *   not gone, however long it stays in doubt
 * - the store gone (its server stopped: connections closed, then refused):
 *   gone, "refused", not before the timeout, and no node lost
 * - 16 nodes beating on a store of their own: each heartbeat round costs
 *   a node 3 ADDs (its counter and the next two nodes'), not one per node:
 *   the store's host serves O(N) per round, not O(N^2) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "pmix/xnode.h"
#include "wire/tcpstore.h"

#define PREFIX "/u26/dptp/0/"
enum { HB_TIMEOUT_X20 = 10 }; /* 20 x the 0.5 s timeout */
static const double HB_INTERVAL = 0.05, HB_TIMEOUT = 0.5;

static struct dptp_tcpstore_server *store;
static unsigned port;
static struct rdzv_node nodes[2];
static struct pmix_srv srv; /* down: these tests exchange no fence */

static int setup(void **state)
{
	(void)state;
	struct dptp_tcpstore_server_opts so = {.host = "127.0.0.1", .port = 0};
	struct dptp_err e = {0};
	if (dptp_tcpstore_server_create(&so, &store, &e) < 0 || dptp_tcpstore_server_start(store, &e) < 0) {
		fprintf(stderr, "store: %s\n", e.msg);
		return -1;
	}
	port = dptp_tcpstore_server_port(store);
	for (unsigned k = 0; k < 2; k++) {
		nodes[k] = (struct rdzv_node){.nproc = 1, .base = k, .slots = 1, .pid = (int)getpid()};
		snprintf(nodes[k].host, sizeof(nodes[k].host), "node%u", k);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (store) {
		dptp_tcpstore_server_stop(store);
		dptp_tcpstore_server_destroy(store);
		store = NULL;
	}
	return 0;
}

static struct xnode *start(unsigned me, const char *prefix)
{
	struct xnode *x = NULL;
	struct dptp_err e = {0};
	if (xnode_start(&x, "127.0.0.1", port, prefix, nodes, 2, me, 20.0, HB_INTERVAL, HB_TIMEOUT, &srv, &e) < 0)
		fail_msg("xnode_start node %u: %s", me, e.msg);
	return x;
}

/* One loop turn of each live node; *failed gets what xnode_handle said. */
static void turn(struct xnode **x, size_t n, int *failed)
{
	struct pollfd pfd[2 * XNODE_MAX_FDS];
	size_t first[2], cnt[2], total = 0;
	double timeout = 0.02;
	for (size_t i = 0; i < n; i++) {
		first[i] = total;
		cnt[i] = x[i] ? xnode_pollfds(x[i], pfd + total, XNODE_MAX_FDS) : 0;
		total += cnt[i];
		if (x[i])
			timeout = xnode_poll_timeout(x[i], timeout);
	}
	if (timeout < 0)
		timeout = 0;
	poll(pfd, (nfds_t)total, (int)(timeout * 1000.0 + 0.999));
	for (size_t i = 0; i < n; i++) {
		if (!x[i])
			continue;
		int f = xnode_handle(x[i], pfd + first[i], cnt[i]);
		if (failed && f >= 0)
			failed[i] = f;
	}
}

static void drive_for(struct xnode **x, size_t n, double secs)
{
	double end = dptp_now() + secs;
	while (dptp_now() < end)
		turn(x, n, NULL);
}

static void test_lost_node(void **state)
{
	(void)state;
	struct xnode *x[2] = {start(0, PREFIX "a/"), start(1, PREFIX "a/")};
	const char *why = NULL;
	drive_for(x, 2, 2 * HB_TIMEOUT);
	assert_int_equal(xnode_lost(x[0], &why), -1);
	assert_int_equal(xnode_lost(x[1], &why), -1);
	/* node 1's launcher dies: its heartbeats stop */
	xnode_stop(x[1]);
	x[1] = NULL;
	double t0 = dptp_now();
	int lost = -1;
	while ((lost = xnode_lost(x[0], &why)) < 0 && dptp_now() - t0 < HB_TIMEOUT_X20 * HB_TIMEOUT)
		turn(x, 1, NULL);
	double took = dptp_now() - t0;
	assert_int_equal(lost, 1);
	assert_non_null(strstr(why, "no heartbeat"));
	assert_true(took >= HB_TIMEOUT);
	xnode_stop(x[0]);
}

static void test_no_loss_once_finished(void **state)
{
	(void)state;
	struct xnode *x[2] = {start(0, PREFIX "b/"), start(1, PREFIX "b/")};
	const char *why = NULL;
	xnode_finish(x[0], 20.0);
	xnode_finish(x[1], 20.0);
	double t0 = dptp_now();
	while ((!xnode_finished(x[0]) || !xnode_finished(x[1])) && dptp_now() - t0 < HB_TIMEOUT_X20 * HB_TIMEOUT)
		turn(x, 2, NULL);
	assert_true(xnode_finished(x[0]));
	assert_true(xnode_finished(x[1]));
	xnode_stop(x[1]);
	x[1] = NULL;
	drive_for(x, 1, 3 * HB_TIMEOUT);
	assert_int_equal(xnode_lost(x[0], &why), -1);
	xnode_stop(x[0]);
}

static void test_failure_reported(void **state)
{
	(void)state;
	struct xnode *x[2] = {start(0, PREFIX "c/"), start(1, PREFIX "c/")};
	struct dptp_tcpstore_client_opts co = {.host = "127.0.0.1", .port = (uint16_t)port, .timeout = 10};
	struct dptp_tcpstore_client *c = NULL;
	struct dptp_err e = {0};
	int failed[2] = {-1, -1};
	drive_for(x, 2, 0.1);
	assert_int_equal(failed[0], -1);
	assert_int_equal(dptp_tcpstore_client_create(&co, &c, &e), 0);
	assert_int_equal(dptp_tcpstore_client_set_prefix(c, ""), 0); /* raw keys, as xnode's */
	/* as rendezvous_report_failure: node 1's attempt failed */
	assert_int_equal(dptp_tcpstore_client_set(c, PREFIX "c/failed", "1", 1, &e), 0);
	dptp_tcpstore_client_destroy(c);
	double t0 = dptp_now();
	while ((failed[0] < 0 || failed[1] < 0) && dptp_now() - t0 < HB_TIMEOUT_X20 * HB_TIMEOUT)
		turn(x, 2, failed);
	assert_true(failed[0] >= 0);
	assert_true(failed[1] >= 0);
	const char *why = NULL;
	assert_int_equal(xnode_lost(x[0], &why), -1); /* a failure, not a loss */
	xnode_stop(x[0]);
	xnode_stop(x[1]);
}

/* last: the store goes */
/* Every node's loop turn, n nodes of the ring test. */
static void turn_n(struct xnode **x, size_t n)
{
	struct pollfd *pfd = calloc(n * XNODE_MAX_FDS, sizeof(*pfd));
	size_t *first = calloc(n, sizeof(*first)), *cnt = calloc(n, sizeof(*cnt)), total = 0;
	double timeout = 0.02;
	assert_non_null(pfd);
	assert_non_null(first);
	assert_non_null(cnt);
	for (size_t i = 0; i < n; i++) {
		first[i] = total;
		cnt[i] = xnode_pollfds(x[i], pfd + total, XNODE_MAX_FDS);
		total += cnt[i];
		timeout = xnode_poll_timeout(x[i], timeout);
	}
	poll(pfd, (nfds_t)total, (int)((timeout > 0 ? timeout : 0) * 1000.0 + 0.999));
	for (size_t i = 0; i < n; i++)
		xnode_handle(x[i], pfd + first[i], cnt[i]);
	free(pfd);
	free(first);
	free(cnt);
}

static void test_ring_load(void **state)
{
	(void)state;
	enum { N = 16 };
	struct rdzv_node nd[N];
	struct xnode *x[N];
	struct dptp_tcpstore_server *s = NULL;
	struct dptp_tcpstore_server_opts so = {.host = "127.0.0.1", .port = 0};
	struct dptp_err e = {0};
	assert_int_equal(dptp_tcpstore_server_create(&so, &s, &e), 0);
	assert_int_equal(dptp_tcpstore_server_start(s, &e), 0);
	unsigned sp = dptp_tcpstore_server_port(s);
	for (unsigned k = 0; k < N; k++) {
		nd[k] = (struct rdzv_node){.nproc = 1, .base = k, .slots = 1, .pid = (int)getpid()};
		snprintf(nd[k].host, sizeof(nd[k].host), "node%u", k);
	}
	for (unsigned k = 0; k < N; k++)
		if (xnode_start(&x[k], "127.0.0.1", sp, PREFIX "r/", nd, N, k, 20.0, HB_INTERVAL, HB_TIMEOUT, &srv, &e) < 0)
			fail_msg("xnode_start node %u: %s", k, e.msg);
	double end = dptp_now() + 20 * HB_INTERVAL;
	while (dptp_now() < end)
		turn_n(x, N);
	for (unsigned k = 0; k < N; k++) {
		assert_int_equal(xnode_lost(x[k], NULL), -1);
		xnode_stop(x[k]);
	}
	/* the rounds made: the sum of the nodes' own counters (N more ADDs) */
	struct dptp_tcpstore_client_opts co = {.host = "127.0.0.1", .port = (uint16_t)sp, .timeout = 10};
	struct dptp_tcpstore_client *c = NULL;
	int64_t rounds = 0;
	assert_int_equal(dptp_tcpstore_client_create(&co, &c, &e), 0);
	assert_int_equal(dptp_tcpstore_client_set_prefix(c, ""), 0); /* xnode's keys are whole */
	for (unsigned k = 0; k < N; k++) {
		char key[64];
		int64_t v = 0;
		snprintf(key, sizeof(key), PREFIX "r/hb/%u", k);
		assert_int_equal(dptp_tcpstore_client_add(c, key, 0, &v, &e), 0);
		rounds += v;
	}
	dptp_tcpstore_client_destroy(c);
	dptp_tcpstore_server_stop(s);
	char line[2048];
	dptp_tcpstore_server_stats(s, line, sizeof(line));
	dptp_tcpstore_server_destroy(s);
	const char *a = strstr(line, " add=");
	assert_non_null(a);
	long long adds = strtoll(a + 5, NULL, 10) - N;
	/* a round of 3 ADDs per node, the last maybe unanswered when stopped */
	assert_true(rounds >= N);
	if (adds > 3 * (rounds + N))
		fail_msg("%lld heartbeat ADDs for %lld rounds of %d nodes: more than 3 per node and round", adds,
			(long long)rounds, N);
}

static void test_store_doubt_alive(void **state)
{
	(void)state;
	struct xnode *x[2] = {start(0, PREFIX "e/"), start(1, PREFIX "e/")};
	drive_for(x, 2, 0.1);
	xnode_store_doubt(x[0], "a request timed out", dptp_now());
	drive_for(x, 2, 4 * HB_TIMEOUT);
	assert_null(xnode_store_gone(x[0]));
	assert_int_equal(xnode_lost(x[0], NULL), -1);
	xnode_stop(x[0]);
	xnode_stop(x[1]);
}

static void test_store_lost(void **state)
{
	(void)state;
	struct xnode *x[1] = {start(1, PREFIX "d/")};
	const char *why = NULL, *gone = NULL;
	drive_for(x, 1, 0.1);
	assert_int_equal(xnode_lost(x[0], &why), -1);
	dptp_tcpstore_server_stop(store);
	dptp_tcpstore_server_destroy(store);
	store = NULL;
	double t0 = dptp_now();
	while (!(gone = xnode_store_gone(x[0])) && dptp_now() - t0 < HB_TIMEOUT_X20 * HB_TIMEOUT)
		turn(x, 1, NULL);
	assert_non_null(gone);
	assert_true(dptp_now() - t0 >= HB_TIMEOUT * 0.99);
	assert_non_null(strstr(gone, "refused"));
	assert_int_equal(xnode_lost(x[0], &why), -1);
	xnode_stop(x[0]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lost_node),
		cmocka_unit_test(test_no_loss_once_finished),
		cmocka_unit_test(test_failure_reported),
		cmocka_unit_test(test_ring_load),
		cmocka_unit_test(test_store_doubt_alive),
		cmocka_unit_test(test_store_lost),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
