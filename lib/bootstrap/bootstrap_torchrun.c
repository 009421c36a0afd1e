/* Bootstrap from torchrun's environment over a TCPStore: RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT. With TORCHELASTIC_USE_AGENT_STORE=True every rank is a
 * client of the agent's store; otherwise rank 0 hosts the store on
 * MASTER_PORT, as torch's env:// rendezvous does. Keys live under
 * "dptp/<run id>/<restart>/" so they cannot clash with torch's. */
#include "bootstrap/bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wire/tcpstore.h"

struct tr_impl {
	struct dptp_tcpstore_server *server; /* rank 0 without an agent store */
	struct dptp_tcpstore_client *client;
	uint64_t fences;
};

/* An unset variable takes `def`; one set but empty is an error, never 0. */
static int env_int(const char *name, int def, int min, int max, int *out, struct dptp_err *err)
{
	const char *s = getenv(name);
	if (!s) {
		*out = def;
		return 0;
	}
	if (!*s)
		return dptp_err_set(err, -EINVAL, "empty %s: expected an integer in %d..%d", name, min, max);
	uint64_t v;
	if (dptp_parse_u64(s, (uint64_t)min, (uint64_t)max, false, &v) < 0)
		return dptp_err_set(err, -EINVAL, "invalid %s='%s': expected an integer in %d..%d", name, s, min, max);
	*out = (int)v;
	return 0;
}

static int tr_put(struct dptp_bootstrap *b, const char *key, const void *data, size_t len,
		  struct dptp_err *err)
{
	struct tr_impl *im = b->impl;
	char k[300];
	snprintf(k, sizeof(k), "kv/%s/%d", key, b->rank);
	return dptp_tcpstore_client_set(im->client, k, data, len, err);
}

/* The second process to claim a rank leaves its name here; the others read
 * it when a fence or get times out, and report that instead. */
static int claim_rank(struct dptp_bootstrap *b, struct tr_impl *im, struct dptp_err *err)
{
	char k[64], who[320];
	snprintf(k, sizeof(k), "claim/%d", b->rank);
	int64_t n = 0;
	DPTP_TRY(dptp_tcpstore_client_add(im->client, k, 1, &n, err));
	if (n <= 1)
		return 0;
	snprintf(who, sizeof(who), "RANK=%d is claimed by two processes (the second: pid %ld on %s)", b->rank,
		 (long)getpid(), b->hostname);
	int64_t d;
	dptp_tcpstore_client_set(im->client, "claim/dup", who, strlen(who), NULL);
	dptp_tcpstore_client_add(im->client, "claim/dups", 1, &d, NULL);
	return dptp_err_set(err, -EEXIST, "%s: each process needs its own RANK", who);
}

/* After a timeout: -EEXIST when a rank was claimed twice, else rc. */
static int duplicate_or(struct tr_impl *im, int rc, struct dptp_err *err)
{
	int64_t d = 0;
	if (rc != -ETIMEDOUT || dptp_tcpstore_client_add(im->client, "claim/dups", 0, &d, NULL) < 0 || d == 0)
		return rc;
	struct dptp_tcpstore_buf v = {0};
	if (dptp_tcpstore_client_get(im->client, "claim/dup", &v, NULL) < 0)
		return rc;
	rc = dptp_err_set(err, -EEXIST, "%.*s: the job cannot form (each process needs its own RANK)", (int)v.len,
			  v.data ? (const char *)v.data : "");
	free(v.data);
	return rc;
}

static int tr_fence(struct dptp_bootstrap *b, double timeout, struct dptp_err *err)
{
	struct tr_impl *im = b->impl;
	char k[64], done[80];
	uint64_t n = ++im->fences;
	snprintf(k, sizeof(k), "fence/%llu", (unsigned long long)n);
	snprintf(done, sizeof(done), "fence/%llu/done", (unsigned long long)n);
	dptp_tcpstore_client_set_timeout(im->client, timeout);
	int64_t arrived = 0;
	DPTP_TRY(dptp_tcpstore_client_add(im->client, k, 1, &arrived, err));
	if (arrived == b->size)
		DPTP_TRY(dptp_tcpstore_client_set(im->client, done, "1", 1, err));
	const char *keys[1] = { done };
	int rc = dptp_tcpstore_client_wait(im->client, keys, 1, timeout, err);
	if (rc == -ETIMEDOUT)
		rc = dptp_err_set(err, -ETIMEDOUT,
			"fence over %d ranks did not complete within %.3g s (a peer never arrived)", b->size, timeout);
	return duplicate_or(im, rc, err);
}

static int tr_get(struct dptp_bootstrap *b, int rank, const char *key, void **data, size_t *len,
		  double timeout, struct dptp_err *err)
{
	struct tr_impl *im = b->impl;
	char k[300];
	snprintf(k, sizeof(k), "kv/%s/%d", key, rank);
	const char *keys[1] = { k };
	int rc = dptp_tcpstore_client_wait(im->client, keys, 1, timeout > 0 ? timeout : 0.001, err);
	if (rc == -ETIMEDOUT)
		rc = dptp_err_set(err, -ETIMEDOUT, "rank %d published no '%s' within %.3g s", rank, key, timeout);
	if (rc < 0)
		return duplicate_or(im, rc, err);
	dptp_tcpstore_client_set_timeout(im->client, timeout > 0 ? timeout : 1);
	struct dptp_tcpstore_buf v = {0};
	DPTP_TRY(dptp_tcpstore_client_get(im->client, k, &v, err));
	*data = v.data ? v.data : malloc(1);
	*len = v.len;
	return *data ? 0 : -ENOMEM;
}

static void tr_abort(struct dptp_bootstrap *b, int status, const char *msg)
{
}

static void tr_destroy(struct dptp_bootstrap *b)
{
	struct tr_impl *im = b->impl;
	if (im) {
		if (im->server && im->client) {
			/* the store lives in rank 0: keep it until everyone has left */
			char k[32] = "leave", done[32] = "leave/done";
			int64_t n = 0;
			dptp_tcpstore_client_set_timeout(im->client, 5);
			if (dptp_tcpstore_client_add(im->client, k, 1, &n, NULL) == 0 && n < b->size) {
				const char *keys[1] = { done };
				dptp_tcpstore_client_wait(im->client, keys, 1, 5, NULL);
			}
		} else if (im->client) {
			int64_t n = 0;
			dptp_tcpstore_client_set_timeout(im->client, 5);
			if (dptp_tcpstore_client_add(im->client, "leave", 1, &n, NULL) == 0 && n == b->size)
				dptp_tcpstore_client_set(im->client, "leave/done", "1", 1, NULL);
		}
		dptp_tcpstore_client_destroy(im->client);
		dptp_tcpstore_server_destroy(im->server);
		free(im);
	}
	free(b);
}

static const struct dptp_bootstrap_ops tr_ops = {
	.name = "torchrun",
	.put = tr_put,
	.fence = tr_fence,
	.publish = tr_put,
	.get = tr_get,
	.abort = tr_abort,
	.destroy = tr_destroy,
};

int dptp_bootstrap_torchrun_create(struct dptp_bootstrap **out, double timeout, struct dptp_err *err)
{
	struct dptp_bootstrap *b = calloc(1, sizeof(*b));
	struct tr_impl *im = calloc(1, sizeof(*im));
	int rc = 0, port = 0;
	if (!b || !im) {
		free(b);
		free(im);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	b->ops = &tr_ops;
	b->impl = im;
	if ((rc = env_int("WORLD_SIZE", 1, 1, 1 << 20, &b->size, err)) < 0 ||
	    (rc = env_int("RANK", 0, 0, b->size - 1, &b->rank, err)) < 0 ||
	    (rc = env_int("LOCAL_WORLD_SIZE", 1, 1, b->size, &b->local_size, err)) < 0 ||
	    (rc = env_int("LOCAL_RANK", 0, 0, b->local_size - 1, &b->local_rank, err)) < 0 ||
	    (rc = env_int("GROUP_WORLD_SIZE", 1, 1, b->size, &b->nnodes, err)) < 0 ||
	    (rc = env_int("GROUP_RANK", 0, 0, b->nnodes - 1, &b->node, err)) < 0 ||
	    (rc = env_int("MASTER_PORT", 0, 1, 65535, &port, err)) < 0 ||
	    (rc = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20, &(int){0}, err)) < 0)
		goto fail;
	if (!getenv("LOCAL_RANK") && b->local_size > 1) {
		/* rank 0's device for everyone: a false device-map verdict */
		rc = dptp_err_set(err, -EINVAL, "LOCAL_RANK is not set but LOCAL_WORLD_SIZE=%d: which device is this rank's?",
				  b->local_size);
		goto fail;
	}
	const char *addr = getenv("MASTER_ADDR");
	if (!addr || !*addr) {
		rc = dptp_err_set(err, -EINVAL, "empty MASTER_ADDR: the store's host is needed");
		goto fail;
	}
	const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
	const char *run_id = getenv("TORCHELASTIC_RUN_ID");
	const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
	bool use_agent = agent && strcmp(agent, "True") == 0;
	gethostname(b->hostname, sizeof(b->hostname) - 1);
	snprintf(b->engine, sizeof(b->engine), "torchrun");
	snprintf(b->job_id, sizeof(b->job_id), "tr-%s-%s-%s-%d", run_id ? run_id : "none",
		 restart ? restart : "0", addr, port);

	if (!(timeout > 0))
		timeout = 300;
	if (!use_agent && b->rank == 0) {
		/* bind exactly MASTER_ADDR, not every interface */
		struct dptp_tcpstore_server_opts so = { .host = addr, .port = (uint16_t)port };
		rc = dptp_tcpstore_server_create(&so, &im->server, err);
		if (rc == 0)
			rc = dptp_tcpstore_server_start(im->server, err);
		if (rc < 0) {
			dptp_err_prefix(err, "rank 0 hosting the store on port %d (TORCHELASTIC_USE_AGENT_STORE is not True)", port);
			goto fail;
		}
	}
	struct dptp_tcpstore_client_opts co = {
		.host = addr, .port = (uint16_t)port, .timeout = timeout, .add_init = false,
	};
	rc = dptp_tcpstore_client_create(&co, &im->client, err);
	if (rc < 0) {
		dptp_err_prefix(err, "connecting to the store at %s:%d (MASTER_ADDR:MASTER_PORT)", addr, port);
		goto fail;
	}
	char prefix[512];
	snprintf(prefix, sizeof(prefix), "dptp/%s/%s", run_id ? run_id : "none", restart ? restart : "0");
	rc = dptp_tcpstore_client_push_prefix(im->client, prefix);
	if (rc < 0) {
		dptp_err_set(err, rc, "store key prefix too long");
		goto fail;
	}
	if ((rc = claim_rank(b, im, err)) < 0)
		goto fail;
	*out = b;
	return 0;
fail:
	dptp_tcpstore_client_destroy(im->client);
	dptp_tcpstore_server_destroy(im->server);
	free(im);
	free(b);
	return rc;
}
