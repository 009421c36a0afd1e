/* resources: each replica derives its own resources from its DP coordinate,
 * as serving engines do (mechanisms C and I of reference/FAMILY.md):
 *
 * - a loopback TCP port, base + DP rank, really bound and listening by the
 *   replica's first rank. The base is agreed over the bootstrap: global
 *   rank 0 probes, from a start derived from the job id, for dp consecutive
 *   free ports, so that two jobs at once do not collide. Replica 0's engine
 *   starts first (it hosts the DP coordinator); the others then start
 *   together, as the engines' launchers order them.
 * - a POSIX shared-memory segment per TP group and host, created with
 *   O_CREAT|O_EXCL by the group's first member on that host under a name
 *   that holds the job, the host, the group and the DP rank; every member
 *   then opens it by name and reads its header.
 * - a payload chosen by DP index, written into the segment; every member
 *   checks its checksum against its own replica's.
 *
 * Proves that the coordinates map one-to-one onto replicas (claims are
 * gathered: no two replicas derive the same DP rank) and that every
 * replica's resources are its own. Everything is closed and unlinked. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "plane/shm.h"

#define PAYLOAD_WORDS 1024
#define SEG_MAGIC 0x6470747072657321ULL /* "dptpres!" */
#define PORT_LO 20000
#define PORT_SPAN 12000 /* below Linux's ephemeral range (32768..) */

struct seg {
	uint64_t magic;
	uint64_t job;      /* hash of the job id */
	int32_t group;     /* the TP group's first global rank */
	int32_t dp;        /* the DP rank its creator derived */
	uint64_t sum;      /* checksum of the payload */
	uint32_t payload[PAYLOAD_WORDS];
};

/* What each rank tells the others once its resources are taken. */
struct claim {
	int32_t dp;        /* derived DP rank */
	int32_t leader;    /* binds the replica's port */
	int32_t port;      /* bound, or -errno */
	int32_t pad;
};

struct state {
	uint64_t job;
	int dp;            /* the DP rank this replica derived */
	bool leader, creator;
	int creator_index; /* group-local rank of this host's creator */
	char name[128];
	int32_t base;      /* agreed port base (rank 0 probes) */
	int probe_rc;
	int sock, port, bind_errno;
	int create_errno;  /* of the O_EXCL creation, creators only */
	bool created;
	int seg_fd;        /* the creator's, locked until the name is gone (plane/shm.h) */
	int open_errno;    /* of the member's open by name */
	struct seg got;    /* the header and payload as a member read them */
	struct claim *claims;
	int xrc;
	struct dptp_err xerr;
};

/* The DP rank a replica derives for its resources: its coordinate -- or,
 * with dp-rank-reset, 0 (the rank reset after start-up: vLLM issue 56949,
 * SGLang PR 29211 and issue 4149). */
static int resources_dp_rank(const struct dptp_ctx *c)
{
	if (dptp_fault_on(c->p.faults, DPTP_FAULT_DP_RANK_RESET))
		return 0;
	return c->me.dp;
}

/* The segment's name: job, host, TP group and DP rank -- or, with
 * shm-name-no-group, the creator's group-local rank alone (vLLM PR 18536,
 * TensorRT-LLM PR 7377); job and host stay, so that a faulty job never
 * disturbs another one. */
static void resources_shm_name(const struct dptp_ctx *c, const struct state *s, char *out, size_t n)
{
	char host[40];
	size_t k = 0;
	for (const char *p = c->b->hostname; *p && k + 1 < sizeof(host); p++)
		host[k++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
			    *p == '-' || *p == '.' ? *p : '_';
	host[k] = 0;
	if (dptp_fault_on(c->p.faults, DPTP_FAULT_SHM_NAME_NO_GROUP))
		snprintf(out, n, "/dptp-lk-res-%016llx-%s-r%d", (unsigned long long)s->job, host, s->creator_index);
	else
		snprintf(out, n, "/dptp-lk-res-%016llx-%s-tp%d-dp%d", (unsigned long long)s->job, host,
			 c->tp.ranks[0] / c->layout.tp, s->dp);
}

static uint32_t payload_word(uint64_t seed, int d, int i)
{
	return (uint32_t)dptp_mix64(seed ^ 0x7e5a11ULL ^ ((uint64_t)d << 32) ^ (uint64_t)i);
}

static uint64_t checksum(const uint32_t *w)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (int i = 0; i < PAYLOAD_WORDS; i++)
		h = dptp_mix64(h ^ w[i]);
	return h;
}

static uint64_t replica_sum(uint64_t seed, int d)
{
	uint32_t w[PAYLOAD_WORDS];
	for (int i = 0; i < PAYLOAD_WORDS; i++)
		w[i] = payload_word(seed, d, i);
	return checksum(w);
}

static int bind_port(int port, int *fd)
{
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || (fd && listen(s, 1) < 0)) {
		int e = -errno;
		close(s);
		return e;
	}
	if (fd)
		*fd = s;
	else
		close(s);
	return 0;
}

/* Rank 0: dp consecutive loopback ports free right now, from a start
 * derived from the job id (bound and released at once: a socket that never
 * connected leaves no TIME_WAIT behind). */
static int probe_base(const struct dptp_ctx *c, uint64_t job, struct dptp_err *err)
{
	int dp = c->layout.dp;
	int span = PORT_SPAN - dp;
	for (int t = 0; t < 256; t++) {
		int base = PORT_LO + (int)((dptp_mix64(job + (uint64_t)t)) % (uint64_t)span);
		bool ok = true;
		int fds[64];
		int held = 0;
		for (int d = 0; d < dp && ok; d++) {
			int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)(base + d)),
						 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
			if (s >= 0 && held < 64)
				fds[held++] = s;
			else if (s >= 0)
				close(s);
		}
		for (int i = 0; i < held; i++)
			close(fds[i]);
		if (ok)
			return base;
	}
	return dptp_err_set(err, -EADDRINUSE, "no %d consecutive free loopback ports found in %d..%d", dp,
			    PORT_LO, PORT_LO + PORT_SPAN);
}

static int resources_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	s->sock = -1;
	s->seg_fd = -1;
	s->claims = calloc((size_t)c->layout.world, sizeof(*s->claims));
	if (!s->claims)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	uint64_t job = 0x1dULL;
	for (const char *p = c->b->job_id; *p; p++)
		job = dptp_mix64(job ^ (unsigned char)*p);
	/* and the attempt: a segment left by a killed earlier attempt of the
	 * same job never meets this one's O_EXCL */
	s->job = job = dptp_mix64(job ^ c->attempt);
	s->dp = resources_dp_rank(c);
	s->leader = c->me.tp == 0 && c->me.pp == 0;
	/* the creator: the group's first member on this host */
	int myhost = c->host_of[c->rank];
	for (int i = 0; i < c->tp.size; i++)
		if (c->host_of[c->tp.ranks[i]] == myhost) {
			s->creator_index = i;
			s->creator = c->tp.ranks[i] == c->rank;
			break;
		}
	resources_shm_name(c, s, s->name, sizeof(s->name));
	if (c->rank == 0) {
		int base = probe_base(c, job, err);
		if (base < 0)
			return base;
		s->base = base;
	}
	return 0;
}

static void take_port(struct dptp_ctx *c, struct state *s)
{
	s->port = s->base + s->dp;
	int rc = bind_port(s->port, &s->sock);
	s->bind_errno = rc < 0 ? -rc : 0;
}

static void create_segment(const struct dptp_ctx *c, struct state *s)
{
	int fd = dptp_shm_create_locked(s->name, sizeof(struct seg));
	if (fd < 0) {
		s->create_errno = -fd;
		return;
	}
	s->created = true;
	s->seg_fd = fd;
	struct seg *m = mmap(NULL, sizeof(struct seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		s->create_errno = errno;
		return;
	}
	m->magic = SEG_MAGIC;
	m->job = s->job;
	m->group = c->tp.ranks[0];
	m->dp = s->dp;
	for (int i = 0; i < PAYLOAD_WORDS; i++)
		m->payload[i] = payload_word(c->p.seed, s->dp, i); /* chosen by the derived DP index */
	m->sum = checksum(m->payload);
	munmap(m, sizeof(struct seg));
}

static void read_segment(struct state *s)
{
	int fd = shm_open(s->name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0) {
		s->open_errno = errno;
		return;
	}
	struct stat st;
	void *m = MAP_FAILED;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct seg))
		m = mmap(NULL, sizeof(struct seg), PROT_READ, MAP_SHARED, fd, 0);
	else
		errno = EPROTO;
	if (m == MAP_FAILED) {
		s->open_errno = errno;
	} else {
		memcpy(&s->got, m, sizeof(s->got));
		munmap(m, sizeof(struct seg));
	}
	close(fd);
}

static void resources_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	struct dptp_err e = {0};
	int rc = dptp_xchg_bcast(&c->x, &c->world, 0, &s->base, sizeof(s->base), &e);
	dptp_err_keep(&s->xrc, &s->xerr, rc, &e);
	/* replica 0's engine starts first; every group creates its segment */
	if (rc == 0 && s->leader && c->me.dp == 0)
		take_port(c, s);
	if (rc == 0 && s->creator)
		create_segment(c, s);
	rc = dptp_xchg_barrier(&c->x, &c->world, &e);
	dptp_err_keep(&s->xrc, &s->xerr, rc, &e);
	/* the other engines start; every member opens its group's segment */
	if (s->xrc == 0 && s->leader && c->me.dp != 0)
		take_port(c, s);
	if (s->xrc == 0)
		read_segment(s);
	struct claim me = { .dp = s->dp, .leader = s->leader,
			    .port = s->bind_errno ? -s->bind_errno : s->port };
	rc = dptp_xchg_allgather(&c->x, &c->world, &me, sizeof(me), s->claims, &e);
	dptp_err_keep(&s->xrc, &s->xerr, rc, &e);
	if (s->xrc < 0)
		dptp_result_fail(res, DPTP_FAIL, s->xrc, &s->xerr, "agreeing on the resources");
}

/* Which replica's payload a checksum is, or -1. */
static int payload_owner(const struct dptp_ctx *c, uint64_t sum)
{
	for (int d = 0; d < c->layout.dp; d++)
		if (replica_sum(c->p.seed, d) == sum)
			return d;
	return -1;
}

static void resources_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	if (res->status >= DPTP_FAIL)
		return;
	int myd = c->me.dp, tp = c->layout.tp;
	int mygroup = c->tp.ranks[0];
	uint64_t want = replica_sum(c->p.seed, myd);
	if (s->leader && s->bind_errno == EADDRINUSE)
		dptp_result_set(res, DPTP_FAIL, "replica %d's port: zmq.error.ZMQError: Address already in use "
				"(addr='tcp://127.0.0.1:%d')", myd, s->port);
	else if (s->leader && s->bind_errno)
		dptp_result_set(res, DPTP_FAIL, "replica %d's port %d: bind: %s", myd, s->port, strerror(s->bind_errno));
	else if (s->leader && s->port != s->base + myd)
		dptp_result_set(res, DPTP_FAIL, "replica %d bound port %d, which is replica %d's (base %d + DP rank)",
				myd, s->port, s->port - s->base, s->base);
	else if (s->creator && s->create_errno == EEXIST)
		dptp_result_set(res, DPTP_FAIL, "FileExistsError: [Errno 17] File exists: '%s' (TP group [%d..%d])",
				s->name, mygroup, mygroup + tp - 1);
	else if (s->creator && s->create_errno)
		dptp_result_set(res, DPTP_FAIL, "creating shared memory '%s': %s", s->name, strerror(s->create_errno));
	else if (s->open_errno)
		dptp_result_set(res, DPTP_FAIL, "open shm in SHMManager failed. errno: %d ('%s': %s)", s->open_errno,
				s->name, strerror(s->open_errno));
	else if (s->got.magic != SEG_MAGIC || s->got.job != s->job)
		dptp_result_set(res, DPTP_FAIL, "segment '%s' is not this job's", s->name);
	else if (s->got.group != mygroup)
		dptp_result_set(res, DPTP_FAIL, "segment '%s' belongs to TP group [%d..%d], not this rank's [%d..%d]",
				s->name, s->got.group, s->got.group + tp - 1, mygroup, mygroup + tp - 1);
	else if (checksum(s->got.payload) != s->got.sum)
		dptp_result_set(res, DPTP_FAIL, "payload in '%s' does not match its checksum", s->name);
	else if (s->got.sum != want) {
		int o = payload_owner(c, s->got.sum);
		char whose[48] = "an unknown replica's";
		if (o >= 0)
			snprintf(whose, sizeof(whose), "replica %d's", o);
		dptp_result_set(res, DPTP_FAIL, "replica %d holds %s payload (checksum %016llx), not its own (%016llx)",
				myd, whose, (unsigned long long)s->got.sum, (unsigned long long)want);
	}
	/* one-to-one: a replica that derived another's DP rank says whose */
	for (int r = 0; s->dp != myd && r < c->layout.world; r++)
		if (s->claims[r].leader && s->claims[r].dp == s->dp && r != c->rank) {
			if (res->status == DPTP_PASS)
				dptp_result_set(res, DPTP_FAIL, "DP coordinates are not one-to-one");
			dptp_result_append(res, "; replica %d derived DP rank %d, as global rank %d (replica %d) did",
					   myd, s->dp, r, dptp_layout_coord(&c->layout, r).dp);
			break;
		}
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "%s%d, segment '%s' of TP group [%d..%d], payload %016llx: replica %d's own",
				s->leader ? "port " : "replica port ", s->base + myd, s->name, mygroup, mygroup + tp - 1,
				(unsigned long long)want, myd);
}

static void resources_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	if (s->sock >= 0)
		close(s->sock);
	if (s->created)
		shm_unlink(s->name);
	if (s->seg_fd >= 0)
		close(s->seg_fd); /* after the name: "alive" until it is gone */
	free(s->claims);
}

const struct dptp_check dptp_check_resources = {
	.name = "resources",
	.summary = "each replica's port, shared-memory segment and payload, derived from its DP coordinate, are its own",
	.mech = "C,I",
	.state_size = sizeof(struct state),
	.prepare = resources_prepare,
	.run = resources_run,
	.verify = resources_verify,
	.release = resources_release,
};
