/* dptp-run --audit: the LD_PRELOAD recorder (libdptp-audit.so), appended to
 * the workers' LD_PRELOAD. It writes the records of lib/base/audit_rec.h
 * (sock, shm, dev, nccl) for bind/connect/listen on AF_UNIX and AF_INET/6,
 * shm_open/shm_unlink and opens under /dev/shm, cudaSetDevice, and NCCL
 * communicator creation and collectives where libcudart/libnccl are loaded.
 *
 * Each wrapper calls the next definition (dlsym(RTLD_NEXT)) and writes one
 * record with one write(2) built in a stack buffer without stdio or malloc:
 * async-signal-safe once the next definitions are resolved (at load for the
 * libc calls). Only the worker records (its parent is dptp-run, named by
 * DPTP_AUDIT_PPID); a forked child stops recording. */
/* open and open64 are both interposed: neither may be renamed to the other */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/audit_rec.h"

#define EXPORT __attribute__((visibility("default")))

static int rec_fd = -1;

/* ---- a record in a stack buffer ------------------------------------- */

struct line {
	char b[1024];
	size_t n;
};

static void put(struct line *l, const char *s)
{
	while (*s && l->n < sizeof(l->b) - 2)
		l->b[l->n++] = *s++;
}

static void put_int(struct line *l, long long v)
{
	char tmp[24];
	int k = 0;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
	do
		tmp[k++] = (char)('0' + u % 10);
	while ((u /= 10) && k < 22);
	if (v < 0)
		tmp[k++] = '-';
	while (k && l->n < sizeof(l->b) - 2)
		l->b[l->n++] = tmp[--k];
}

/* a JSON string of n bytes: control bytes and non-ASCII as \u00XX */
static void put_str(struct line *l, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	put(l, "\"");
	for (size_t i = 0; i < n && l->n < sizeof(l->b) - 10; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\') {
			l->b[l->n++] = '\\';
			l->b[l->n++] = (char)c;
		} else if (c < 0x20 || c >= 0x7f) {
			put(l, "\\u00");
			l->b[l->n++] = hex[c >> 4];
			l->b[l->n++] = hex[c & 15];
		} else {
			l->b[l->n++] = (char)c;
		}
	}
	put(l, "\"");
}

static void put_key_int(struct line *l, const char *key, long long v)
{
	put(l, ",\"");
	put(l, key);
	put(l, "\":");
	put_int(l, v);
}

static void put_time(struct line *l)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	char frac[8];
	long us = ts.tv_nsec / 1000;
	for (int k = 5; k >= 0; k--, us /= 10)
		frac[k] = (char)('0' + us % 10);
	frac[6] = '\0';
	put(l, ",\"t\":");
	put_int(l, (long long)ts.tv_sec);
	put(l, ".");
	put(l, frac);
}

static void emit(struct line *l)
{
	int fd = rec_fd;
	if (fd < 0)
		return;
	put_time(l);
	l->b[l->n++] = '}';
	l->b[l->n++] = '\n';
	int e = errno;
	ssize_t w = write(fd, l->b, l->n);
	(void)w;
	errno = e;
}

static void begin(struct line *l, const char *kind, const char *call)
{
	l->n = 0;
	put(l, "{\"k\":\"");
	put(l, kind);
	put(l, "\"");
	if (call) {
		put(l, ",\"call\":\"");
		put(l, call);
		put(l, "\"");
	}
}

/* ---- the next definitions -------------------------------------------- */

static int (*next_bind)(int, const struct sockaddr *, socklen_t);
static int (*next_connect)(int, const struct sockaddr *, socklen_t);
static int (*next_listen)(int, int);
static int (*next_shm_open)(const char *, int, mode_t);
static int (*next_shm_unlink)(const char *);
static int (*next_open)(const char *, int, ...);
static int (*next_open64)(const char *, int, ...);
static int (*next_openat)(int, const char *, int, ...);
static int (*next_openat64)(int, const char *, int, ...);

/* The library a wrapped CUDA or NCCL symbol lives in may not be in the
 * global scope (torch loads libtorch_cuda, and with it libnccl, with
 * RTLD_LOCAL): RTLD_NEXT misses it while its callers still reach our
 * definition. Then the loaded object whose name holds `lib` is asked. */
struct find_lib {
	const char *lib, *sym;
	void *fn;
};

static int find_in(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find_lib *f = arg;
	(void)size;
	if (!info->dlpi_name || !strstr(info->dlpi_name, f->lib))
		return 0;
	void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return 0;
	f->fn = dlsym(h, f->sym);
	dlclose(h);
	return f->fn != NULL;
}

static void *next_in(const char *name, const char *lib)
{
	void *fn = dlsym(RTLD_NEXT, name);
	if (!fn && lib) {
		struct find_lib f = {lib, name, NULL};
		dl_iterate_phdr(find_in, &f);
		fn = f.fn;
	}
	return fn;
}

static void *next(const char *name)
{
	return next_in(name, !strncmp(name, "nccl", 4) ? "libnccl" : !strncmp(name, "cuda", 4) ? "libcudart" : NULL);
}

static void forget(void)
{
	if (rec_fd >= 0)
		close(rec_fd);
	rec_fd = -1;
}

static int env_int(const char *name, int dflt)
{
	const char *v = getenv(name);
	return v && *v ? atoi(v) : dflt;
}

__attribute__((constructor)) static void audit_preload_init(void)
{
	next_bind = (int (*)(int, const struct sockaddr *, socklen_t))next("bind");
	next_connect = (int (*)(int, const struct sockaddr *, socklen_t))next("connect");
	next_listen = (int (*)(int, int))next("listen");
	next_shm_open = (int (*)(const char *, int, mode_t))next("shm_open");
	next_shm_unlink = (int (*)(const char *))next("shm_unlink");
	next_open = (int (*)(const char *, int, ...))next("open");
	next_open64 = (int (*)(const char *, int, ...))next("open64");
	next_openat = (int (*)(int, const char *, int, ...))next("openat");
	next_openat64 = (int (*)(int, const char *, int, ...))next("openat64");

	const char *dir = getenv(DPTP_AUDIT_DIR_ENV), *ppid = getenv(DPTP_AUDIT_PPID_ENV);
	if (!dir || !ppid || atoi(ppid) != (int)getppid() || !next_open)
		return;
	int rank = env_int("RANK", -1), att = env_int("TORCHELASTIC_RESTART_COUNT", 0);
	char path[4096];
	struct line l;
	l.n = 0;
	put(&l, dir);
	put(&l, "/r");
	put_int(&l, rank);
	put(&l, ".a");
	put_int(&l, att);
	put(&l, ".c.jsonl");
	if (l.n >= sizeof(path))
		return;
	memcpy(path, l.b, l.n);
	path[l.n] = '\0';
	rec_fd = next_open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (rec_fd < 0)
		return;
	pthread_atfork(NULL, NULL, forget);
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	begin(&l, "hello", NULL);
	put(&l, ",\"rec\":\"c\"");
	put_key_int(&l, "rank", rank);
	put_key_int(&l, "world", env_int("WORLD_SIZE", -1));
	put_key_int(&l, "local_rank", env_int("LOCAL_RANK", -1));
	put_key_int(&l, "pid", getpid());
	put(&l, ",\"host\":");
	put_str(&l, host, strlen(host));
	put_key_int(&l, "att", att);
	emit(&l);
}

/* ---- sockets --------------------------------------------------------- */

/* Whether the code at ret (a caller's return address) belongs to libnccl:
 * NCCL binds ports of its own (its RAS thread, 28028 by default, in every
 * process since NCCL 2.24) and coordinates them itself; they are no name
 * the program chose. */
static bool in_libnccl(const void *ret)
{
	Dl_info di;
	if (!ret || !dladdr(ret, &di) || !di.dli_fname)
		return false;
	const char *b = strrchr(di.dli_fname, '/');
	return !strncmp(b ? b + 1 : di.dli_fname, "libnccl", 7);
}

static void sock_record(const char *call, int fd, const struct sockaddr *sa, socklen_t len, int rc, int err,
			const void *ret)
{
	struct line l;
	if (rec_fd < 0)
		return;
	if (!sa) { /* listen: the address the socket is bound to */
		struct sockaddr_storage st;
		socklen_t sl = sizeof(st);
		if (getsockname(fd, (struct sockaddr *)&st, &sl) < 0)
			return;
		sock_record(call, fd, (struct sockaddr *)&st, sl, rc, err, ret);
		return;
	}
	begin(&l, "sock", call);
	if (sa->sa_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)sa;
		size_t off = offsetof(struct sockaddr_un, sun_path), n = len > off ? len - off : 0;
		put(&l, ",\"fam\":\"unix\",\"addr\":");
		if (n && un->sun_path[0] == '\0') { /* abstract: "@name" */
			char name[110];
			name[0] = '@';
			size_t k = n - 1 < sizeof(name) - 1 ? n - 1 : sizeof(name) - 1;
			memcpy(name + 1, un->sun_path + 1, k);
			put_str(&l, name, k + 1);
		} else {
			put_str(&l, un->sun_path, strnlen(un->sun_path, n < sizeof(un->sun_path) ? n : sizeof(un->sun_path)));
		}
	} else if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		const unsigned char *ip = (const unsigned char *)&in->sin_addr;
		put(&l, ",\"fam\":\"inet\",\"addr\":\"");
		for (int k = 0; k < 4; k++) {
			if (k)
				put(&l, ".");
			put_int(&l, ip[k]);
		}
		put(&l, "\"");
		put_key_int(&l, "port", ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		put(&l, ",\"fam\":\"inet6\"");
		put_key_int(&l, "port", ntohs(in6->sin6_port));
	} else {
		return;
	}
	put_key_int(&l, "rc", rc);
	put_key_int(&l, "err", rc < 0 ? err : 0);
	if (in_libnccl(ret))
		put(&l, ",\"by\":\"nccl\"");
	emit(&l);
}

EXPORT int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	if (!next_bind)
		next_bind = (int (*)(int, const struct sockaddr *, socklen_t))next("bind");
	int rc = next_bind(fd, sa, len), e = errno;
	if (sa)
		sock_record("bind", fd, sa, len, rc, e, __builtin_return_address(0));
	errno = e;
	return rc;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	if (!next_connect)
		next_connect = (int (*)(int, const struct sockaddr *, socklen_t))next("connect");
	int rc = next_connect(fd, sa, len), e = errno;
	if (sa && sa->sa_family == AF_UNIX) /* TCP connections are gloo's and NCCL's mesh */
		sock_record("connect", fd, sa, len, rc, e, __builtin_return_address(0));
	errno = e;
	return rc;
}

EXPORT int listen(int fd, int backlog)
{
	if (!next_listen)
		next_listen = (int (*)(int, int))next("listen");
	int rc = next_listen(fd, backlog), e = errno;
	sock_record("listen", fd, NULL, 0, rc, e, __builtin_return_address(0));
	errno = e;
	return rc;
}

/* ---- shared memory --------------------------------------------------- */

static void shm_record(const char *call, const char *name, int flags, int rc, int err)
{
	struct line l;
	if (rec_fd < 0 || !name)
		return;
	begin(&l, "shm", call);
	put(&l, ",\"name\":");
	put_str(&l, name, strlen(name));
	put_key_int(&l, "fl", flags);
	put_key_int(&l, "rc", rc);
	put_key_int(&l, "err", rc < 0 ? err : 0);
	emit(&l);
}

EXPORT int shm_open(const char *name, int flags, mode_t mode)
{
	if (!next_shm_open)
		next_shm_open = (int (*)(const char *, int, mode_t))next("shm_open");
	int rc = next_shm_open(name, flags, mode), e = errno;
	shm_record("shm_open", name, flags, rc, e);
	errno = e;
	return rc;
}

EXPORT int shm_unlink(const char *name)
{
	if (!next_shm_unlink)
		next_shm_unlink = (int (*)(const char *))next("shm_unlink");
	int rc = next_shm_unlink(name), e = errno;
	shm_record("shm_unlink", name, 0, rc, e);
	errno = e;
	return rc;
}

static bool under_dev_shm(const char *path)
{
	return path && !strncmp(path, "/dev/shm/", 9);
}

static mode_t mode_arg(int flags, va_list ap)
{
	return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

/* open(path, flags[, mode]) and openat(dirfd, path, flags[, mode]): PRE
 * and PREARG are the leading dirfd parameter and argument, or nothing. */
#define OPEN_WRAPPER(fn, nextp, PRE, PREARG)                                         \
	EXPORT int fn(PRE const char *path, int flags, ...)                          \
	{                                                                            \
		va_list ap;                                                          \
		va_start(ap, flags);                                                 \
		mode_t mode = mode_arg(flags, ap);                                   \
		va_end(ap);                                                          \
		if (!nextp)                                                          \
			nextp = (int (*)(PRE const char *, int, ...))next(#fn);      \
		int rc = nextp(PREARG path, flags, mode), e = errno;                 \
		if (under_dev_shm(path))                                             \
			shm_record("open", path, flags, rc, e);                      \
		errno = e;                                                           \
		return rc;                                                           \
	}
OPEN_WRAPPER(open, next_open, , )
OPEN_WRAPPER(open64, next_open64, , )
#define DIRFD_PARAM int dirfd,
#define DIRFD_ARG dirfd,
OPEN_WRAPPER(openat, next_openat, DIRFD_PARAM, DIRFD_ARG)
OPEN_WRAPPER(openat64, next_openat64, DIRFD_PARAM, DIRFD_ARG)

/* ---- CUDA and NCCL (only called where libcudart/libnccl are loaded) ---- */

typedef struct {
	char internal[128];
} nccl_unique_id;
typedef void *nccl_comm;

/* the interposed CUDA and NCCL entry points (their headers are not needed) */
EXPORT int cudaSetDevice(int dev);
EXPORT int ncclCommInitRank(nccl_comm *comm, int nranks, nccl_unique_id id, int rank);
EXPORT int ncclCommInitRankConfig(nccl_comm *comm, int nranks, nccl_unique_id id, int rank, void *config);
EXPORT int ncclCommSplit(nccl_comm comm, int color, int key, nccl_comm *newcomm, void *config);
EXPORT int ncclCommInitRankScalable(nccl_comm *comm, int nranks, int rank, int nid, nccl_unique_id *ids, void *config);
EXPORT int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, nccl_comm c, void *st);
EXPORT int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, nccl_comm c, void *st);
EXPORT int ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, nccl_comm c, void *st);
EXPORT int ncclAllGather(const void *s, void *r, size_t n, int dt, nccl_comm c, void *st);
EXPORT int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, nccl_comm c, void *st);
EXPORT int ncclSend(const void *s, size_t n, int dt, int peer, nccl_comm c, void *st);
EXPORT int ncclRecv(void *r, size_t n, int dt, int peer, nccl_comm c, void *st);

static int cur_device(void)
{
	static int (*get)(int *);
	int dev = -1;
	if (!get)
		get = (int (*)(int *))next("cudaGetDevice");
	if (get && get(&dev) != 0)
		dev = -1;
	return dev;
}

EXPORT int cudaSetDevice(int dev)
{
	static int (*nx)(int);
	if (!nx)
		nx = (int (*)(int))next("cudaSetDevice");
	if (!nx)
		return 3; /* cudaErrorInitializationError */
	int rc = nx(dev);
	if (rec_fd >= 0) {
		static int last = -1;
		if (dev != last) { /* device guards switch back and forth */
			struct line l;
			last = dev;
			begin(&l, "dev", NULL);
			put_key_int(&l, "dev", dev);
			put(&l, ",\"how\":\"cudaSetDevice\",\"site\":\"\"");
			put_key_int(&l, "rc", rc);
			emit(&l);
		}
	}
	return rc;
}

/* communicators by address, named by a hash of their unique id */
#define MAX_COMMS 256
static struct {
	nccl_comm comm;
	uint64_t id;
} comms[MAX_COMMS];
static int ncomms;
static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static void comm_note(nccl_comm c, uint64_t id)
{
	pthread_mutex_lock(&comms_mu);
	if (ncomms < MAX_COMMS)
		comms[ncomms++] = (typeof(comms[0])){c, id};
	pthread_mutex_unlock(&comms_mu);
}

static uint64_t comm_id(nccl_comm c)
{
	for (int i = 0; i < ncomms && i < MAX_COMMS; i++)
		if (comms[i].comm == c)
			return comms[i].id;
	return 0;
}

static void put_hex(struct line *l, const char *key, uint64_t v)
{
	static const char hex[] = "0123456789abcdef";
	char s[17];
	for (int k = 15; k >= 0; k--, v >>= 4)
		s[k] = hex[v & 15];
	s[16] = '\0';
	put(l, ",\"");
	put(l, key);
	put(l, "\":\"");
	put(l, s);
	put(l, "\"");
}

static void nccl_init_record(uint64_t id, int nranks, int rank, int rc)
{
	struct line l;
	if (rec_fd < 0)
		return;
	begin(&l, "nccl", "init");
	put_hex(&l, "id", id);
	put_key_int(&l, "nranks", nranks);
	put_key_int(&l, "crank", rank);
	put_key_int(&l, "dev", cur_device());
	put_key_int(&l, "rc", rc);
	emit(&l);
}

EXPORT int ncclCommInitRank(nccl_comm *comm, int nranks, nccl_unique_id id, int rank)
{
	static int (*nx)(nccl_comm *, int, nccl_unique_id, int);
	if (!nx)
		nx = (int (*)(nccl_comm *, int, nccl_unique_id, int))next("ncclCommInitRank");
	if (!nx)
		return 3; /* ncclSystemError */
	int rc = nx(comm, nranks, id, rank);
	uint64_t h = fnv(&id, sizeof(id), 0xcbf29ce484222325ULL);
	if (rc == 0 && comm)
		comm_note(*comm, h);
	nccl_init_record(h, nranks, rank, rc);
	return rc;
}

EXPORT int ncclCommInitRankConfig(nccl_comm *comm, int nranks, nccl_unique_id id, int rank, void *config)
{
	static int (*nx)(nccl_comm *, int, nccl_unique_id, int, void *);
	if (!nx)
		nx = (int (*)(nccl_comm *, int, nccl_unique_id, int, void *))next("ncclCommInitRankConfig");
	if (!nx)
		return 3;
	int rc = nx(comm, nranks, id, rank, config);
	uint64_t h = fnv(&id, sizeof(id), 0xcbf29ce484222325ULL);
	if (rc == 0 && comm)
		comm_note(*comm, h);
	nccl_init_record(h, nranks, rank, rc);
	return rc;
}

/* NCCL 2.23+: one or more ids for one communicator; the first names it */
EXPORT int ncclCommInitRankScalable(nccl_comm *comm, int nranks, int rank, int nid, nccl_unique_id *ids, void *config)
{
	static int (*nx)(nccl_comm *, int, int, int, nccl_unique_id *, void *);
	if (!nx)
		nx = (int (*)(nccl_comm *, int, int, int, nccl_unique_id *, void *))next("ncclCommInitRankScalable");
	if (!nx)
		return 3;
	int rc = nx(comm, nranks, rank, nid, ids, config);
	uint64_t h = nid > 0 && ids ? fnv(&ids[0], sizeof(ids[0]), 0xcbf29ce484222325ULL) : 0;
	if (rc == 0 && comm)
		comm_note(*comm, h);
	nccl_init_record(h, nranks, rank, rc);
	return rc;
}

EXPORT int ncclCommSplit(nccl_comm comm, int color, int key, nccl_comm *newcomm, void *config)
{
	static int (*nx)(nccl_comm, int, int, nccl_comm *, void *);
	static int (*count)(nccl_comm, int *), (*user_rank)(nccl_comm, int *);
	if (!nx) {
		nx = (int (*)(nccl_comm, int, int, nccl_comm *, void *))next("ncclCommSplit");
		count = (int (*)(nccl_comm, int *))next("ncclCommCount");
		user_rank = (int (*)(nccl_comm, int *))next("ncclCommUserRank");
	}
	if (!nx)
		return 3;
	int rc = nx(comm, color, key, newcomm, config), n = -1, r = -1;
	uint64_t parent = comm_id(comm), h = fnv(&color, sizeof(color), parent ? parent : 0xcbf29ce484222325ULL);
	if (rc == 0 && newcomm && *newcomm) {
		comm_note(*newcomm, h);
		if (count)
			count(*newcomm, &n);
		if (user_rank)
			user_rank(*newcomm, &r);
	}
	if (color >= 0)
		nccl_init_record(h, n, r, rc);
	return rc;
}

static void nccl_op_record(const char *op, nccl_comm comm, size_t count, int dtype, int root, int rc)
{
	struct line l;
	if (rec_fd < 0)
		return;
	begin(&l, "nccl", "op");
	put(&l, ",\"op\":\"");
	put(&l, op);
	put(&l, "\"");
	put_hex(&l, "id", comm_id(comm));
	put_key_int(&l, "n", (long long)count);
	put_key_int(&l, "dt", dtype);
	if (root >= 0)
		put_key_int(&l, "root", root);
	put_key_int(&l, "rc", rc);
	emit(&l);
}

/* A collective: its record, then the next definition. PARAMS and ARGS
 * spell the signature; COUNT and ROOT name the record's fields (-1: none). */
#define NCCL_OP(fn, name, PARAMS, ARGS, COUNT, ROOT)                                 \
	EXPORT int fn PARAMS                                                          \
	{                                                                            \
		static int(*nx) PARAMS;                                              \
		if (!nx)                                                             \
			nx = (int(*) PARAMS)next(#fn);                               \
		if (!nx)                                                             \
			return 3; /* ncclSystemError */                              \
		nccl_op_record(name, c, COUNT, dt, ROOT, 0);                         \
		return nx ARGS;                                                      \
	}
NCCL_OP(ncclAllReduce, "all_reduce", (const void *s, void *r, size_t n, int dt, int op, nccl_comm c, void *st),
	(s, r, n, dt, op, c, st), n, -1)
NCCL_OP(ncclBroadcast, "broadcast", (const void *s, void *r, size_t n, int dt, int root, nccl_comm c, void *st),
	(s, r, n, dt, root, c, st), n, root)
NCCL_OP(ncclReduce, "reduce", (const void *s, void *r, size_t n, int dt, int op, int root, nccl_comm c, void *st),
	(s, r, n, dt, op, root, c, st), n, root)
NCCL_OP(ncclAllGather, "all_gather", (const void *s, void *r, size_t n, int dt, nccl_comm c, void *st),
	(s, r, n, dt, c, st), n, -1)
NCCL_OP(ncclReduceScatter, "reduce_scatter", (const void *s, void *r, size_t n, int dt, int op, nccl_comm c, void *st),
	(s, r, n, dt, op, c, st), n, -1)
NCCL_OP(ncclSend, "send", (const void *s, size_t n, int dt, int peer, nccl_comm c, void *st), (s, n, dt, peer, c, st), n,
	peer)
NCCL_OP(ncclRecv, "recv", (void *r, size_t n, int dt, int peer, nccl_comm c, void *st), (r, n, dt, peer, c, st), n, peer)
