/* dptp-run --audit: the LD_PRELOAD recorder (libdptp-audit.so), appended to
 * the workers' LD_PRELOAD. It writes the records of lib/base/audit_rec.h
 * (hello, sock, shm, dev, nccl, gpu, cap, end) for bind/connect/listen on
 * AF_UNIX and AF_INET/6, shm_open/shm_unlink and opens under /dev/shm,
 * cudaSetDevice, NCCL communicator creation and collectives, and CUDA IPC
 * and VMM shareable-handle exports and imports where libcudart, libcuda and
 * libnccl are loaded.
 *
 * Every process with DPTP_AUDIT_DIR in its environment records, into its
 * own file a<att>.p<pid>.c.jsonl: a forked child opens its own file (a
 * pthread_atfork handler) and an exec'd image appends to its pid's file,
 * numbering itself from DPTP_AUDIT_IMG=<pid>:<image>, the one variable the
 * recorder sets (in place, in a buffer of its own).
 *
 * Each wrapper calls the next definition (dlsym(RTLD_NEXT)) and writes one
 * record with one write(2) built in a stack buffer without stdio or malloc:
 * async-signal-safe once the next definitions are resolved (at load for the
 * libc calls). The record descriptor is moved high (>= 1000, or near the
 * top of RLIMIT_NOFILE when lower) and its (st_dev, st_ino) checked with
 * fstat before each write: a descriptor the program closed and reused is
 * never written to; the file is opened again by its path. */
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/audit_rec.h"

#define EXPORT __attribute__((visibility("default")))

/* the record file: its descriptor, identity and path */
static int rec_fd = -1;
static dev_t rec_dev;
static ino_t rec_ino;
static char rec_path[4096], rec_dir[3900]; /* the folder, as at start */
static bool rec_on; /* DPTP_AUDIT_DIR was set: this process and its children record */
/* counts of this image: written, lost (write errors, the cap), taken (cap) */
static unsigned long n_written, n_lost, n_taken, rec_max = DPTP_AUDIT_MAX_DEFAULT;
static int rec_ended, torn;
static pid_t rec_pid; /* the process the file is for */
/* the exit status, from exit() or main's return */
static int exit_code;
static bool exit_known;
/* the hello's facts, found once per image */
static struct {
	int rank, world, local_rank, att, img, launcher;
	bool py;
	char exe[512], host[256];
} me;
static char img_env[64];

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

static void put_key_bool(struct line *l, const char *key, bool v)
{
	put(l, ",\"");
	put(l, key);
	put(l, v ? "\":true" : "\":false");
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

/* ---- the record file -------------------------------------------------- */

static int (*next_open)(const char *, int, ...);

/* fd moved to a high number, close-on-exec: >= 1000, or the highest free
 * one below the soft RLIMIT_NOFILE when that is 1000 or less (at most 64
 * tries down); fd itself when none is free. */
static int fd_high(int fd)
{
	struct rlimit rl;
	long lo = 1000;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur <= 1000)
		lo = (long)rl.rlim_cur - 1;
	for (long k = lo; k > fd && k > lo - 64; k--) {
		int h = fcntl(fd, F_DUPFD_CLOEXEC, (int)k);
		if (h >= 0) {
			close(fd);
			return h;
		}
		if (errno != EMFILE && errno != EINVAL)
			break;
	}
	return fd;
}

/* Opens rec_path (appending), moved high; notes its identity. */
static int open_rec(void)
{
	struct stat st;
	if (!next_open)
		return -1;
	int fd = next_open(rec_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	fd = fd_high(fd);
	if (fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	rec_dev = st.st_dev;
	rec_ino = st.st_ino;
	return fd;
}

/* Whether fd is still the record file. */
static bool is_rec(int fd)
{
	struct stat st;
	return fd >= 0 && fstat(fd, &st) == 0 && st.st_ino == rec_ino && st.st_dev == rec_dev;
}

/* Set when the program closed the record descriptor's number or put a
 * descriptor on it (close, close_range, closefrom, dup2, dup3 are
 * interposed); every RECHECK_EVERY-th write checks anyway (a raw syscall). */
static int rec_dirty;
static unsigned rec_writes;
#define RECHECK_EVERY 256

static void touched(int lo, int hi)
{
	int fd = __atomic_load_n(&rec_fd, __ATOMIC_RELAXED);
	if (fd >= lo && fd <= hi)
		__atomic_store_n(&rec_dirty, 1, __ATOMIC_RELEASE);
}

/* The record descriptor, checked after the program touched its number
 * (fstat: st_dev, st_ino): when the program closed it or put a file of its
 * own on it, the file is opened again by path; the program's descriptor is
 * left alone. -1 when not recording. */
static int rec_check(void)
{
	int fd = __atomic_load_n(&rec_fd, __ATOMIC_ACQUIRE);
	if (fd < 0)
		return fd;
	bool dirty = __atomic_exchange_n(&rec_dirty, 0, __ATOMIC_ACQ_REL);
	if (!dirty && __atomic_add_fetch(&rec_writes, 1, __ATOMIC_RELAXED) % RECHECK_EVERY)
		return fd;
	if (is_rec(fd))
		return fd;
	int nfd = open_rec();
	if (nfd < 0)
		return -1;
	if (!__atomic_compare_exchange_n(&rec_fd, &fd, nfd, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		close(nfd); /* another thread reopened it first */
		return fd;
	}
	return nfd;
}

/* Ends l and writes it with one write(2); a short or failed write (ENOSPC,
 * EFBIG, EIO) is counted lost, and a torn line is ended so that the
 * records after it parse. */
static void write_line(struct line *l)
{
	put_time(l);
	l->b[l->n++] = '}';
	l->b[l->n++] = '\n';
	int e = errno, fd = rec_check();
	ssize_t w = -1;
	/* a torn line left by an earlier short write is ended first */
	if (fd >= 0 && __atomic_load_n(&torn, __ATOMIC_RELAXED) && write(fd, "\n", 1) == 1)
		__atomic_store_n(&torn, 0, __ATOMIC_RELAXED);
	if (fd >= 0) {
		do
			w = write(fd, l->b, l->n);
		while (w < 0 && errno == EINTR);
	}
	if (w == (ssize_t)l->n) {
		__atomic_add_fetch(&n_written, 1, __ATOMIC_RELAXED);
	} else {
		__atomic_add_fetch(&n_lost, 1, __ATOMIC_RELAXED);
		if (w > 0 && write(fd, "\n", 1) != 1)
			__atomic_store_n(&torn, 1, __ATOMIC_RELAXED);
	}
	errno = e;
}

/* A record of the program's calls: written while under the cap
 * (DPTP_AUDIT_MAX_RECORDS); the first one over it writes the `cap` record,
 * and the ones after are counted lost. False when the cap dropped it. */
static bool emit(struct line *l)
{
	if (__atomic_load_n(&rec_fd, __ATOMIC_RELAXED) < 0)
		return true;
	unsigned long n = __atomic_add_fetch(&n_taken, 1, __ATOMIC_RELAXED);
	if (n <= rec_max) {
		write_line(l);
		return true;
	}
	__atomic_add_fetch(&n_lost, 1, __ATOMIC_RELAXED);
	if (n == rec_max + 1) {
		struct line c;
		begin(&c, "cap", NULL);
		put_key_int(&c, "max", (long long)rec_max);
		write_line(&c);
	}
	return false;
}

static bool capped(void)
{
	return __atomic_load_n(&n_taken, __ATOMIC_RELAXED) > rec_max;
}

static void counts(void);

/* The file name of the object holding the code at ret (a caller's return
 * address) and the offset into it; NULL when unknown. */
static const char *code_at(const void *ret, uintptr_t *off)
{
	Dl_info di;
	if (!ret || !dladdr(ret, &di) || !di.dli_fname)
		return NULL;
	const char *b = strrchr(di.dli_fname, '/');
	b = b ? b + 1 : di.dli_fname;
	if (!*b) { /* the main program */
		b = strrchr(me.exe, '/');
		b = b ? b + 1 : me.exe;
	}
	*off = (uintptr_t)ret - (uintptr_t)di.dli_fbase;
	return b;
}

/* "lib.so+0xOFF" of the code at ret as the record's site; *by_nccl when
 * that code is libnccl's. */
static void put_site(struct line *l, const void *ret, bool *by_nccl)
{
	static const char hex[] = "0123456789abcdef";
	uintptr_t off;
	const char *b = code_at(ret, &off);
	if (by_nccl)
		*by_nccl = b && !strncmp(b, "libnccl", 7);
	if (!b)
		return;
	char s[300];
	size_t n = strnlen(b, 256);
	memcpy(s, b, n);
	memcpy(s + n, "+0x", 3);
	n += 3;
	int k = 0;
	char tmp[20];
	do
		tmp[k++] = hex[off & 15];
	while ((off >>= 4) && k < 16);
	while (k)
		s[n++] = tmp[--k];
	put(l, ",\"site\":");
	put_str(l, s, n);
}

/* ---- the next definitions -------------------------------------------- */

static int (*next_bind)(int, const struct sockaddr *, socklen_t);
static int (*next_connect)(int, const struct sockaddr *, socklen_t);
static int (*next_listen)(int, int);
static int (*next_shm_open)(const char *, int, mode_t);
static int (*next_shm_unlink)(const char *);
static int (*next_open64)(const char *, int, ...);
static int (*next_openat)(int, const char *, int, ...);
static int (*next_openat64)(int, const char *, int, ...);
static void (*next_exit)(int);
static void (*next__exit)(int);
static void (*next__Exit)(int);

/* The library a wrapped CUDA or NCCL symbol lives in may not be in the
 * global scope (torch loads libtorch_cuda, and with it libnccl, with
 * RTLD_LOCAL): RTLD_NEXT misses it while its callers still reach our
 * definition. Then the loaded object whose name holds `lib` is asked. */
struct find_lib {
	const char *lib, *sym;
	void *fn;
};

#if defined(__x86_64__)
/* the real dlsym (dlsym itself is interposed below) */
__attribute__((visibility("hidden"))) void *dptp_real_dlsym;
__attribute__((visibility("hidden"), used)) void *dptp_resolve_dlsym(void);

void *dptp_resolve_dlsym(void)
{
	void *fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!fn)
		fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	__atomic_store_n(&dptp_real_dlsym, fn, __ATOMIC_RELEASE);
	return fn;
}

static void *raw_dlsym(void *h, const char *name)
{
	void *fn = __atomic_load_n(&dptp_real_dlsym, __ATOMIC_ACQUIRE);
	if (!fn)
		fn = dptp_resolve_dlsym();
	return fn ? ((void *(*)(void *, const char *))fn)(h, name) : NULL;
}
#else
#define raw_dlsym dlsym
#endif

static int find_in(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find_lib *f = arg;
	(void)size;
	if (!info->dlpi_name || !strstr(info->dlpi_name, f->lib))
		return 0;
	void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return 0;
	f->fn = raw_dlsym(h, f->sym);
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

/* nccl* in libnccl, cuda* in libcudart, cu* in libcuda */
static void *next(const char *name)
{
	const char *lib = !strncmp(name, "nccl", 4)   ? "libnccl"
			  : !strncmp(name, "cuda", 4) ? "libcudart"
			  : !strncmp(name, "cu", 2)   ? "libcuda.so"
						      : NULL;
	return next_in(name, lib);
}

static int env_int(const char *name, int dflt)
{
	const char *v = getenv(name);
	return v && *v ? atoi(v) : dflt;
}

/* ---- hello and end ---------------------------------------------------- */

/* rec_path := DIR/a<att>.p<pid>.c.jsonl; false when too long */
static bool make_path(const char *dir, pid_t pid)
{
	struct line l;
	l.n = 0;
	put(&l, dir);
	put(&l, "/a");
	put_int(&l, me.att);
	put(&l, ".p");
	put_int(&l, pid);
	put(&l, ".c.jsonl");
	if (l.n >= sizeof(rec_path) || l.n >= sizeof(l.b) - 3)
		return false;
	memcpy(rec_path, l.b, l.n);
	rec_path[l.n] = '\0';
	return true;
}

/* DPTP_AUDIT_IMG=<pid>:<img>, fixed width, written in place: into the
 * environment's own string when it has that width (so that a program that
 * passes main's envp on, as bash does, passes it too), else into the buffer
 * given to putenv() */
#define IMG_FMT_LEN 17 /* 10 digits, ':', 6 digits */
static char *img_val;

static void set_img_env(pid_t pid, int img)
{
	char v[IMG_FMT_LEN + 1];
	unsigned long p = (unsigned long)pid, m = (unsigned long)img;
	for (int k = 9; k >= 0; k--, p /= 10)
		v[k] = (char)('0' + p % 10);
	v[10] = ':';
	for (int k = 16; k >= 11; k--, m /= 10)
		v[k] = (char)('0' + m % 10);
	v[IMG_FMT_LEN] = '\0';
	if (img_val)
		memcpy(img_val, v, sizeof(v));
}

/* img_val: where the value lives, after the first set_img_env() */
static void place_img_env(void)
{
	char *cur = getenv(DPTP_AUDIT_IMG_ENV);
	if (cur && strlen(cur) == IMG_FMT_LEN) {
		img_val = cur;
		return;
	}
	memcpy(img_env, DPTP_AUDIT_IMG_ENV "=", sizeof(DPTP_AUDIT_IMG_ENV));
	img_val = img_env + sizeof(DPTP_AUDIT_IMG_ENV);
	memset(img_val, '0', IMG_FMT_LEN);
	img_val[IMG_FMT_LEN] = '\0';
	if (putenv(img_env) != 0)
		img_val = NULL;
}

/* The image number of this process image: one more than the one that
 * exec'd it (DPTP_AUDIT_IMG names this pid), else the hellos already in
 * this pid's file (an exec whose environment was copied before a fork),
 * else 0. */
static int image_number(void)
{
	const char *v = getenv(DPTP_AUDIT_IMG_ENV);
	char *end;
	if (v) {
		long pid = strtol(v, &end, 10);
		if (pid == (long)getpid() && *end == ':')
			return atoi(end + 1) + 1;
	}
	int fd = next_open(rec_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	static const char pat[] = "{\"k\":\"hello\"";
	const size_t np = sizeof(pat) - 1;
	char buf[65536];
	size_t have = 0;
	int n = 0;
	for (;;) {
		ssize_t r = read(fd, buf + have, sizeof(buf) - have);
		if (r <= 0)
			break;
		have += (size_t)r;
		size_t i = 0;
		for (; i + np <= have; i++)
			if (buf[i] == '{' && !memcmp(buf + i, pat, np))
				n++;
		memmove(buf, buf + i, have - i);
		have -= i;
	}
	close(fd);
	return n;
}

static void hello(void)
{
	struct line l;
	begin(&l, "hello", NULL);
	put(&l, ",\"rec\":\"c\"");
	put_key_int(&l, "rank", me.rank);
	put_key_int(&l, "world", me.world);
	put_key_int(&l, "local_rank", me.local_rank);
	put_key_int(&l, "pid", getpid());
	put_key_int(&l, "ppid", getppid());
	put_key_bool(&l, "worker", me.launcher > 0 && getppid() == me.launcher);
	put_key_bool(&l, "py", me.py);
	put(&l, ",\"exe\":");
	put_str(&l, me.exe, strlen(me.exe));
	put_key_int(&l, "img", me.img);
	put(&l, ",\"host\":");
	put_str(&l, me.host, strlen(me.host));
	put_key_int(&l, "att", me.att);
	write_line(&l);
}

/* `end`, once per image: how it ended, the exit status when known, and the
 * counts of records written before it and lost */
static void end(const char *how, int code, bool known)
{
	/* not in a vfork()ed child that fails its exec: it shares our memory */
	if (__atomic_load_n(&rec_fd, __ATOMIC_RELAXED) < 0 || getpid() != rec_pid ||
	    __atomic_exchange_n(&rec_ended, 1, __ATOMIC_ACQ_REL))
		return;
	struct line l;
	if (capped())
		counts();
	begin(&l, "end", NULL);
	put(&l, ",\"how\":\"");
	put(&l, how);
	put(&l, "\"");
	if (known)
		put_key_int(&l, "code", code);
	else
		put(&l, ",\"code\":null");
	put_key_int(&l, "records", (long long)__atomic_load_n(&n_written, __ATOMIC_RELAXED));
	put_key_int(&l, "lost", (long long)__atomic_load_n(&n_lost, __ATOMIC_RELAXED));
	/* of lost, the records the cap dropped (no write failure) */
	unsigned long taken = __atomic_load_n(&n_taken, __ATOMIC_RELAXED);
	put_key_int(&l, "dropped", taken > rec_max ? (long long)(taken - rec_max) : 0);
	write_line(&l);
}

static void comm_counts_clear(void);

/* In a forked child: its own file, counts and hello; the parent's
 * descriptor is closed only when it still is the parent's file. */
static void after_fork_child(void)
{
	int old = rec_fd;
	if (!rec_on)
		return;
	rec_fd = -1;
	if (old >= 0 && is_rec(old))
		close(old);
	n_written = n_lost = n_taken = 0;
	comm_counts_clear();
	rec_ended = 0;
	exit_known = false;
	me.img = 0;
	set_img_env(getpid(), 0);
	/* no getenv() here: the folder was kept at start */
	if (!make_path(rec_dir, getpid()))
		return;
	rec_pid = getpid();
	rec_fd = open_rec();
	if (rec_fd >= 0)
		hello();
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
	next_exit = (void (*)(int))next("exit");
	next__exit = (void (*)(int))next("_exit");
	next__Exit = (void (*)(int))next("_Exit");

	const char *dir = getenv(DPTP_AUDIT_DIR_ENV);
	if (!dir || !*dir || strlen(dir) >= sizeof(rec_dir) || !next_open)
		return;
	memcpy(rec_dir, dir, strlen(dir) + 1);
	rec_on = true;
	me.rank = env_int("RANK", -1);
	me.world = env_int("WORLD_SIZE", -1);
	me.local_rank = env_int("LOCAL_RANK", -1);
	me.att = env_int("TORCHELASTIC_RESTART_COUNT", 0);
	me.launcher = env_int(DPTP_AUDIT_PPID_ENV, -1);
	const char *max = getenv(DPTP_AUDIT_MAX_ENV);
	if (max && *max) {
		char *e;
		unsigned long m = strtoul(max, &e, 10);
		if (!*e)
			rec_max = m;
	}
	ssize_t n = readlink("/proc/self/exe", me.exe, sizeof(me.exe) - 1);
	me.exe[n > 0 ? n : 0] = '\0';
	const char *b = strrchr(me.exe, '/');
	me.py = dlsym(RTLD_DEFAULT, "Py_Initialize") || !strncmp(b ? b + 1 : me.exe, "python", 6);
	gethostname(me.host, sizeof(me.host) - 1);
	if (!make_path(dir, getpid()))
		return;
	me.img = image_number();
	place_img_env();
	set_img_env(getpid(), me.img);
	rec_pid = getpid();
	rec_fd = open_rec();
	pthread_atfork(NULL, NULL, after_fork_child);
	if (rec_fd >= 0)
		hello();
}

/* at exit() and main's return (the exit status known from either) */
__attribute__((destructor)) static void audit_preload_fini(void)
{
	end("exit", exit_code, exit_known);
}

/* the next exit function, then the system call should it return */
__attribute__((noreturn)) static void leave(void (*fn)(int), int code)
{
	if (fn)
		fn(code);
	syscall(SYS_exit_group, code);
	__builtin_unreachable();
}

EXPORT void exit(int code)
{
	exit_code = code;
	exit_known = true;
	if (!next_exit)
		next_exit = (void (*)(int))next("exit");
	leave(next_exit, code);
}

/* os._exit() and _exit(2) skip the destructors: the end is written here */
EXPORT void _exit(int code)
{
	end("_exit", code, true);
	leave(next__exit, code);
}

EXPORT void _Exit(int code)
{
	end("_exit", code, true);
	leave(next__Exit, code);
}

/* main's return value: glibc calls exit() from inside itself, where the
 * interposed exit() does not see it */
typedef int (*main_fn)(int, char **, char **);
static main_fn real_main;

static int main_wrap(int argc, char **argv, char **envp)
{
	int rc = real_main(argc, argv, envp);
	exit_code = rc;
	exit_known = true;
	return rc;
}

EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void),
			     void (*rtld_fini)(void), void *stack_end);
EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void),
			     void (*rtld_fini)(void), void *stack_end)
{
	int (*nx)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *) =
		(int (*)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *))dlsym(
			RTLD_NEXT, "__libc_start_main");
	real_main = main;
	return nx(main_wrap, argc, argv, init, fini, rtld_fini, stack_end);
}

/* ---- the program's descriptors: the record descriptor's number -------- */

EXPORT int close(int fd)
{
	static int (*nx)(int);
	if (!nx)
		nx = (int (*)(int))next("close");
	touched(fd, fd);
	return nx(fd);
}

EXPORT int close_range(unsigned int lo, unsigned int hi, int flags);
EXPORT int close_range(unsigned int lo, unsigned int hi, int flags)
{
	static int (*nx)(unsigned int, unsigned int, int);
	if (!nx)
		nx = (int (*)(unsigned int, unsigned int, int))next("close_range");
	touched(lo > INT32_MAX ? INT32_MAX : (int)lo, hi > INT32_MAX ? INT32_MAX : (int)hi);
	if (!nx) {
		errno = ENOSYS;
		return -1;
	}
	return nx(lo, hi, flags);
}

EXPORT void closefrom(int lo);
EXPORT void closefrom(int lo)
{
	static void (*nx)(int);
	if (!nx)
		nx = (void (*)(int))next("closefrom");
	touched(lo, INT32_MAX);
	if (nx)
		nx(lo);
}

EXPORT int dup2(int fd, int to)
{
	static int (*nx)(int, int);
	if (!nx)
		nx = (int (*)(int, int))next("dup2");
	touched(to, to);
	return nx(fd, to);
}

EXPORT int dup3(int fd, int to, int flags)
{
	static int (*nx)(int, int, int);
	if (!nx)
		nx = (int (*)(int, int, int))next("dup3");
	touched(to, to);
	return nx(fd, to, flags);
}

/* ---- sockets --------------------------------------------------------- */

/* NCCL binds ports of its own (its RAS thread, 28028 by default, in every
 * process since NCCL 2.24) and coordinates them itself; they are no name the
 * program chose: such records say "by":"nccl" (the caller's code is
 * libnccl's, see put_site()). */
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
	bool by_nccl;
	put_site(&l, ret, &by_nccl);
	if (by_nccl)
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

static void shm_record(const char *call, const char *name, int flags, int rc, int err, const void *ret)
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
	put_site(&l, ret, NULL);
	emit(&l);
}

EXPORT int shm_open(const char *name, int flags, mode_t mode)
{
	if (!next_shm_open)
		next_shm_open = (int (*)(const char *, int, mode_t))next("shm_open");
	int rc = next_shm_open(name, flags, mode), e = errno;
	shm_record("shm_open", name, flags, rc, e, __builtin_return_address(0));
	errno = e;
	return rc;
}

EXPORT int shm_unlink(const char *name)
{
	if (!next_shm_unlink)
		next_shm_unlink = (int (*)(const char *))next("shm_unlink");
	int rc = next_shm_unlink(name), e = errno;
	shm_record("shm_unlink", name, 0, rc, e, __builtin_return_address(0));
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
			shm_record("open", path, flags, rc, e, __builtin_return_address(0)); \
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
			put(&l, ",\"how\":\"cudaSetDevice\"");
			put_key_int(&l, "rc", rc);
			put_site(&l, __builtin_return_address(0), NULL);
			emit(&l);
		}
	}
	return rc;
}

/* communicators by address, named by a hash of their unique id; per
 * communicator its calls, its collectives and, past the cap, the sum of the
 * terms of the collectives not recorded (the count record's hs) */
#define MAX_COMMS 256
static struct {
	nccl_comm comm;
	uint64_t id;
	uint64_t calls, ncoll, hs;
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

static int comm_slot(nccl_comm c)
{
	for (int i = 0; i < ncomms && i < MAX_COMMS; i++)
		if (comms[i].comm == c)
			return i;
	return -1;
}

static uint64_t comm_id(nccl_comm c)
{
	int i = comm_slot(c);
	return i < 0 ? 0 : comms[i].id;
}

static void comm_counts_clear(void)
{
	for (int i = 0; i < ncomms && i < MAX_COMMS; i++)
		comms[i].calls = comms[i].ncoll = comms[i].hs = 0;
}

/* at the end, past the cap: one count record per communicator with calls */
static void counts(void)
{
	for (int i = 0; i < ncomms && i < MAX_COMMS; i++) {
		uint64_t calls = __atomic_load_n(&comms[i].calls, __ATOMIC_RELAXED);
		if (!calls)
			continue;
		struct line l;
		begin(&l, "count", NULL);
		put_hex(&l, "id", comms[i].id);
		put_key_int(&l, "seq", (long long)calls);
		put_key_int(&l, "nc", (long long)__atomic_load_n(&comms[i].ncoll, __ATOMIC_RELAXED));
		put_hex(&l, "hs", __atomic_load_n(&comms[i].hs, __ATOMIC_RELAXED));
		write_line(&l);
	}
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

/* The term of a collective the cap dropped: its signature
 * "op|n|nccl<dt>|root=R" (audit_rec.h) at place pos. */
static uint64_t nccl_term(const char *op, size_t count, int dtype, int root, uint64_t pos)
{
	struct line s = {.n = 0};
	put(&s, op);
	put(&s, "|");
	put_int(&s, (long long)count);
	put(&s, "|nccl");
	put_int(&s, dtype);
	put(&s, "|");
	if (root >= 0) {
		put(&s, "root=");
		put_int(&s, root);
	}
	return dptp_audit_term(dptp_audit_sig_hash(s.b, s.n), pos);
}

static void nccl_op_record(const char *op, nccl_comm comm, size_t count, int dtype, int root, int rc)
{
	struct line l;
	if (rec_fd < 0)
		return;
	int slot = comm_slot(comm);
	bool coll = strcmp(op, "send") && strcmp(op, "recv");
	uint64_t pos = 0;
	if (slot >= 0) {
		__atomic_add_fetch(&comms[slot].calls, 1, __ATOMIC_RELAXED);
		if (coll)
			pos = __atomic_fetch_add(&comms[slot].ncoll, 1, __ATOMIC_RELAXED);
	}
	begin(&l, "nccl", "op");
	put(&l, ",\"op\":\"");
	put(&l, op);
	put(&l, "\"");
	put_hex(&l, "id", slot < 0 ? 0 : comms[slot].id);
	put_key_int(&l, "n", (long long)count);
	put_key_int(&l, "dt", dtype);
	if (root >= 0)
		put_key_int(&l, "root", root);
	put_key_int(&l, "rc", rc);
	if (!emit(&l) && slot >= 0 && coll)
		__atomic_add_fetch(&comms[slot].hs, nccl_term(op, count, dtype, root, pos), __ATOMIC_RELAXED);
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

/* ---- GPU memory shared between processes ------------------------------ */

/* CUDA IPC handles (cudaIpcMemHandle_t, CUipcMemHandle: 64 bytes, passed
 * by value) and VMM shareable handles (cuMemExportToShareableHandle: a
 * POSIX file descriptor or a 64-byte fabric handle). A `gpu` record's h is
 * equal on the exporter and the importer of the same memory: FNV-1a 64 of
 * the handle's 64 bytes, or for a descriptor (which the importer receives
 * as another number) of its st_dev, st_ino and exporter's pid (8 bytes
 * each, host order; see fd_hash()). */
typedef struct {
	char reserved[64];
} ipc_handle;

#define VMM_FD 0x1     /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define VMM_FABRIC 0x8 /* CU_MEM_HANDLE_TYPE_FABRIC */

EXPORT int cudaIpcGetMemHandle(ipc_handle *handle, void *ptr);
EXPORT int cudaIpcOpenMemHandle(void **ptr, ipc_handle handle, unsigned int flags);
EXPORT int cuIpcGetMemHandle(ipc_handle *handle, unsigned long long dptr);
EXPORT int cuIpcOpenMemHandle(unsigned long long *dptr, ipc_handle handle, unsigned int flags);
EXPORT int cuIpcOpenMemHandle_v2(unsigned long long *dptr, ipc_handle handle, unsigned int flags);
EXPORT int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags);
EXPORT int cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type);
EXPORT int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);
EXPORT int cudaGetDriverEntryPoint(const char *sym, void **pfn, unsigned long long flags, int *status);
EXPORT int cudaGetDriverEntryPointByVersion(const char *sym, void **pfn, unsigned int ver, unsigned long long flags,
					    int *status);

#define FNV_BASIS 0xcbf29ce484222325ULL

/* inside a runtime wrapper (its driver calls are the runtime's) */
static __thread int in_runtime __attribute__((tls_model("initial-exec")));

/* h of a VMM descriptor. Every export descriptor is a new open of
 * /dev/nvidiactl (one st_dev/st_ino for all, measured with driver 580), so
 * the exporter marks its open file description with its pid (F_SETOWN,
 * when no owner is set; nothing is signalled without O_ASYNC): the mark
 * travels with the description (SCM_RIGHTS, pidfd_getfd, inheritance) and
 * the importer reads it back with F_GETOWN. h = FNV-1a of (st_dev, st_ino,
 * that pid); *ino and *xpid for the record. */
static uint64_t fd_hash(int fd, bool exporter, unsigned long long *ino, long long *xpid)
{
	struct stat st;
	uint64_t id[3];
	*ino = 0;
	*xpid = 0;
	if (fstat(fd, &st) < 0)
		return 0;
	int e = errno, own = fcntl(fd, F_GETOWN);
	if (exporter && own == 0 && fcntl(fd, F_SETOWN, getpid()) == 0)
		own = getpid();
	errno = e;
	id[0] = (uint64_t)st.st_dev;
	id[1] = (uint64_t)st.st_ino;
	id[2] = own > 0 ? (uint64_t)own : 0;
	*ino = (unsigned long long)st.st_ino;
	*xpid = own > 0 ? own : 0;
	return fnv(id, sizeof(id), FNV_BASIS);
}

/* the device current in the driver (the calling thread's context), else
 * in the runtime, else -1 */
static int gpu_device(void)
{
	static int (*ctx_dev)(int *);
	int dev = -1;
	if (!ctx_dev)
		ctx_dev = (int (*)(int *))next("cuCtxGetDevice");
	if (ctx_dev && ctx_dev(&dev) == 0)
		return dev;
	return cur_device();
}

static void gpu_record(const char *call, const char *api, const char *ht, uint64_t h, unsigned long long ino,
		       long long xpid, int rc, const void *ret)
{
	struct line l;
	uintptr_t off;
	if (rec_fd < 0)
		return;
	/* the runtime's own driver calls: its call is recorded already */
	const char *b = strcmp(api, "driver") ? NULL : in_runtime ? "libcudart" : code_at(ret, &off);
	if (b && !strncmp(b, "libcudart", 9))
		return;
	begin(&l, "gpu", call);
	put(&l, ",\"api\":\"");
	put(&l, api);
	put(&l, "\",\"ht\":\"");
	put(&l, ht);
	put(&l, "\"");
	put_hex(&l, "h", h);
	if (ino)
		put_key_int(&l, "ino", (long long)ino);
	if (xpid)
		put_key_int(&l, "xpid", xpid);
	put_key_int(&l, "dev", gpu_device());
	put_key_int(&l, "rc", rc);
	bool by_nccl;
	put_site(&l, ret, &by_nccl);
	if (by_nccl)
		put(&l, ",\"by\":\"nccl\"");
	emit(&l);
}

/* The real driver entry points of the wrapped names, as the driver handed
 * them out (cuGetProcAddress, cudaGetDriverEntryPoint) or as found by name. */
static struct drv_fn {
	const char *name;
	void *wrapper, *real;
} drv[] = {
	{"cuIpcGetMemHandle", (void *)cuIpcGetMemHandle, NULL},
	{"cuIpcOpenMemHandle", (void *)cuIpcOpenMemHandle, NULL},
	{"cuIpcOpenMemHandle_v2", (void *)cuIpcOpenMemHandle_v2, NULL},
	{"cuMemExportToShareableHandle", (void *)cuMemExportToShareableHandle, NULL},
	{"cuMemImportFromShareableHandle", (void *)cuMemImportFromShareableHandle, NULL},
	{"cuGetProcAddress", (void *)cuGetProcAddress, NULL},
	{"cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, NULL},
};
enum { DRV_IPC_GET, DRV_IPC_OPEN, DRV_IPC_OPEN2, DRV_EXPORT, DRV_IMPORT, DRV_GPA, DRV_GPA2 };

static void *drv_real(int i)
{
	void *fn = __atomic_load_n(&drv[i].real, __ATOMIC_ACQUIRE);
	if (!fn) {
		fn = next(drv[i].name);
		if (fn == drv[i].wrapper)
			fn = NULL;
		__atomic_store_n(&drv[i].real, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

/* An entry point handed out for sym (*pfn): a wrapped one is kept as the
 * real one and our wrapper handed out instead. cuIpcOpenMemHandle may be
 * handed out as either version: both have the same parameters. */
static int drv_swap(int rc, const char *sym, void **pfn)
{
	if (rc || !sym || !pfn || !*pfn || strncmp(sym, "cu", 2))
		return rc;
	for (size_t i = 0; i < sizeof(drv) / sizeof(drv[0]); i++)
		if (!strcmp(sym, drv[i].name)) {
			if (*pfn != drv[i].wrapper)
				__atomic_store_n(&drv[i].real, *pfn, __ATOMIC_RELEASE);
			*pfn = drv[i].wrapper;
			break;
		}
	return rc;
}

/* an IPC handle's record; h 0 when there is no handle (a failed export) */
static void ipc_record(const char *call, const char *api, const ipc_handle *h, int rc, const void *ret)
{
	gpu_record(call, api, "ipc", h ? fnv(h, sizeof(*h), FNV_BASIS) : 0, 0, 0, rc, ret);
}

EXPORT int cudaIpcGetMemHandle(ipc_handle *handle, void *ptr)
{
	static int (*nx)(ipc_handle *, void *);
	if (!nx)
		nx = (int (*)(ipc_handle *, void *))next("cudaIpcGetMemHandle");
	if (!nx)
		return 3; /* cudaErrorInitializationError */
	in_runtime++;
	int rc = nx(handle, ptr);
	in_runtime--;
	ipc_record("ipc_get", "runtime", rc == 0 ? handle : NULL, rc, __builtin_return_address(0));
	return rc;
}

EXPORT int cudaIpcOpenMemHandle(void **ptr, ipc_handle handle, unsigned int flags)
{
	static int (*nx)(void **, ipc_handle, unsigned int);
	if (!nx)
		nx = (int (*)(void **, ipc_handle, unsigned int))next("cudaIpcOpenMemHandle");
	if (!nx)
		return 3;
	in_runtime++;
	int rc = nx(ptr, handle, flags);
	in_runtime--;
	ipc_record("ipc_open", "runtime", &handle, rc, __builtin_return_address(0));
	return rc;
}

EXPORT int cuIpcGetMemHandle(ipc_handle *handle, unsigned long long dptr)
{
	int (*nx)(ipc_handle *, unsigned long long) = (int (*)(ipc_handle *, unsigned long long))drv_real(DRV_IPC_GET);
	if (!nx)
		return 3; /* CUDA_ERROR_NOT_INITIALIZED */
	int rc = nx(handle, dptr);
	ipc_record("ipc_get", "driver", rc == 0 ? handle : NULL, rc, __builtin_return_address(0));
	return rc;
}

static int ipc_open_driver(int which, unsigned long long *dptr, ipc_handle handle, unsigned int flags, const void *ret)
{
	int (*nx)(unsigned long long *, ipc_handle, unsigned int) =
		(int (*)(unsigned long long *, ipc_handle, unsigned int))drv_real(which);
	if (!nx)
		nx = (int (*)(unsigned long long *, ipc_handle, unsigned int))drv_real(which == DRV_IPC_OPEN ? DRV_IPC_OPEN2
													: DRV_IPC_OPEN);
	if (!nx)
		return 3;
	int rc = nx(dptr, handle, flags);
	ipc_record("ipc_open", "driver", &handle, rc, ret);
	return rc;
}

EXPORT int cuIpcOpenMemHandle(unsigned long long *dptr, ipc_handle handle, unsigned int flags)
{
	return ipc_open_driver(DRV_IPC_OPEN, dptr, handle, flags, __builtin_return_address(0));
}

EXPORT int cuIpcOpenMemHandle_v2(unsigned long long *dptr, ipc_handle handle, unsigned int flags)
{
	return ipc_open_driver(DRV_IPC_OPEN2, dptr, handle, flags, __builtin_return_address(0));
}

EXPORT int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags)
{
	int (*nx)(void *, unsigned long long, int, unsigned long long) =
		(int (*)(void *, unsigned long long, int, unsigned long long))drv_real(DRV_EXPORT);
	if (!nx)
		return 3;
	int rc = nx(shareable, handle, type, flags);
	unsigned long long ino = 0;
	long long xpid = 0;
	uint64_t h = 0;
	if (rc == 0 && shareable && type == VMM_FD)
		h = fd_hash(*(int *)shareable, true, &ino, &xpid);
	else if (rc == 0 && shareable && type == VMM_FABRIC)
		h = fnv(shareable, 64, FNV_BASIS);
	gpu_record("vmm_export", "driver", type == VMM_FD ? "fd" : type == VMM_FABRIC ? "fabric" : "other", h, ino, xpid,
		   rc, __builtin_return_address(0));
	return rc;
}

EXPORT int cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type)
{
	int (*nx)(unsigned long long *, void *, int) = (int (*)(unsigned long long *, void *, int))drv_real(DRV_IMPORT);
	if (!nx)
		return 3;
	unsigned long long ino = 0;
	long long xpid = 0;
	uint64_t h = 0;
	/* before the call: the importer may close the descriptor once imported */
	if (type == VMM_FD)
		h = fd_hash((int)(intptr_t)os_handle, false, &ino, &xpid);
	else if (type == VMM_FABRIC && os_handle)
		h = fnv(os_handle, 64, FNV_BASIS);
	int rc = nx(handle, os_handle, type);
	gpu_record("vmm_import", "driver", type == VMM_FD ? "fd" : type == VMM_FABRIC ? "fabric" : "other", h, ino, xpid,
		   rc, __builtin_return_address(0));
	return rc;
}

/* The driver's entry points by name (CUDA 11.3+; the runtime and NCCL get
 * theirs this way): the wrapped ones are handed out as ours. */
EXPORT int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
	int (*nx)(const char *, void **, int, unsigned long long) =
		(int (*)(const char *, void **, int, unsigned long long))drv_real(DRV_GPA);
	if (!nx)
		return 3;
	return drv_swap(nx(sym, pfn, ver, flags), sym, pfn);
}

EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
	int (*nx)(const char *, void **, int, unsigned long long, int *) =
		(int (*)(const char *, void **, int, unsigned long long, int *))drv_real(DRV_GPA2);
	if (!nx)
		return 3;
	return drv_swap(nx(sym, pfn, ver, flags, status), sym, pfn);
}

/* The runtime's way to the driver's entry points (torch's c10 driver API). */
EXPORT int cudaGetDriverEntryPoint(const char *sym, void **pfn, unsigned long long flags, int *status)
{
	static int (*nx)(const char *, void **, unsigned long long, int *);
	if (!nx)
		nx = (int (*)(const char *, void **, unsigned long long, int *))next("cudaGetDriverEntryPoint");
	if (!nx)
		return 3;
	return drv_swap(nx(sym, pfn, flags, status), sym, pfn);
}

EXPORT int cudaGetDriverEntryPointByVersion(const char *sym, void **pfn, unsigned int ver, unsigned long long flags,
					    int *status)
{
	static int (*nx)(const char *, void **, unsigned int, unsigned long long, int *);
	if (!nx)
		nx = (int (*)(const char *, void **, unsigned int, unsigned long long, int *))next(
			"cudaGetDriverEntryPointByVersion");
	if (!nx)
		return 3;
	return drv_swap(nx(sym, pfn, ver, flags, status), sym, pfn);
}

/* ---- dlsym: driver entry points taken from a handle of libcuda -------- */

/* cuda-python (flashinfer's workspaces), NCCL and the runtime take libcuda's
 * entry points with dlsym(their handle, "cuGetProcAddress_v2") or by name,
 * which never asks the interposed definitions. On x86-64 dlsym is
 * interposed: for a handle, the wrapped names are handed out as ours (the
 * runtime's own driver calls are then left out by gpu_record());
 * RTLD_DEFAULT and RTLD_NEXT go to the real dlsym by a tail jump, so that
 * it sees its caller (RTLD_NEXT is relative to the caller's object, and
 * RTLD_DEFAULT searches the caller's scope). */
#if defined(__x86_64__)
__attribute__((visibility("hidden"), used)) void *dptp_dlsym_handle(void *h, const char *name);

void *dptp_dlsym_handle(void *h, const char *name)
{
	void *fn = ((void *(*)(void *, const char *))dptp_real_dlsym)(h, name);
	if (fn && name && name[0] == 'c' && name[1] == 'u')
		drv_swap(0, name, &fn);
	return fn;
}

__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	"dlsym:\n"
	"	endbr64\n"
	"	movq dptp_real_dlsym(%rip), %rax\n"
	"	testq %rax, %rax\n"
	"	jnz 1f\n"
	"	pushq %rdi\n"
	"	pushq %rsi\n"
	"	subq $8, %rsp\n"
	"	call dptp_resolve_dlsym\n"
	"	addq $8, %rsp\n"
	"	popq %rsi\n"
	"	popq %rdi\n"
	"1:	testq %rdi, %rdi\n" /* RTLD_DEFAULT */
	"	jz 2f\n"
	"	cmpq $-1, %rdi\n" /* RTLD_NEXT */
	"	je 2f\n"
	"	jmp dptp_dlsym_handle\n"
	"2:	jmp *%rax\n"
	".size dlsym, .-dlsym\n");
#endif
