#include "base/util.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>
#include <time.h>

/* Messages are one line on a terminal whatever a user typed: control
 * bytes (a newline, an escape sequence) in quoted values become \xNN. */
static void one_line(char *msg, size_t cap)
{
	char tmp[DPTP_ERR_MAX];
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)msg; *p && o + 5 < sizeof(tmp); p++) {
		if (*p < 0x20 || *p == 0x7f)
			o += (size_t)snprintf(tmp + o, sizeof(tmp) - o, "\\x%02x", *p);
		else
			tmp[o++] = (char)*p;
	}
	tmp[o] = 0;
	snprintf(msg, cap, "%s", tmp);
}

int dptp_err_set(struct dptp_err *err, int rc, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		one_line(err->msg, sizeof(err->msg));
	}
	return rc;
}

void dptp_err_prefix(struct dptp_err *err, const char *fmt, ...)
{
	if (!err)
		return;
	char pre[DPTP_ERR_MAX], old[DPTP_ERR_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	snprintf(err->msg, sizeof(err->msg), "%s: %s", pre, old);
	one_line(err->msg, sizeof(err->msg));
}

void dptp_err_keep(int *rc, struct dptp_err *err, int nrc, const struct dptp_err *nerr)
{
	if (nrc < 0 && *rc == 0) {
		*rc = nrc;
		if (err && nerr)
			*err = *nerr;
	}
}

double dptp_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dptp_parse_u64(const char *s, uint64_t min, uint64_t max, bool allow_suffix, uint64_t *out)
{
	/* decimal, as torch reads its numbers (Python int(), std::stoi):
	 * "010" is ten, "0x8" is refused */
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	char *end = NULL;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s)
		return -EINVAL;
	if (errno == ERANGE)
		return -ERANGE;
	if (allow_suffix && *end) {
		unsigned shift = 0;
		switch (*end) {
		case 'k': case 'K': shift = 10; break;
		case 'm': case 'M': shift = 20; break;
		case 'g': case 'G': shift = 30; break;
		default: return -EINVAL;
		}
		end++;
		if (v > (UINT64_MAX >> shift))
			return -ERANGE;
		v <<= shift;
	}
	if (*end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

const char *dptp_host_unbracket(const char *host, char *buf, size_t len)
{
	size_t n = host ? strlen(host) : 0;
	if (n < 2 || host[0] != '[' || host[n - 1] != ']' || n - 2 >= len)
		return host;
	memcpy(buf, host + 1, n - 2);
	buf[n - 2] = '\0';
	return buf;
}

int dptp_parse_double(const char *s, double min, double max, double *out)
{
	if (!s || !*s || *s == ' ' || *s == '\t' || strpbrk(s, "xX"))
		return -EINVAL; /* decimal, as Python's float(): no hex floats */
	errno = 0;
	char *end = NULL;
	double v = strtod(s, &end);
	if (end == s || *end)
		return -EINVAL;
	if (errno == ERANGE || !isfinite(v))
		return -ERANGE;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int dptp_entropy(void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}


#define BIG_ALIGN ((size_t)2 << 20)

static size_t big_len(size_t bytes)
{
	return (bytes + BIG_ALIGN - 1) / BIG_ALIGN * BIG_ALIGN;
}

static void *big_map(size_t len)
{
	/* map one alignment more, keep the aligned part */
	char *raw = mmap(NULL, len + BIG_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	char *p = (char *)(((uintptr_t)raw + BIG_ALIGN - 1) & ~(uintptr_t)(BIG_ALIGN - 1));
	if (p > raw)
		munmap(raw, (size_t)(p - raw));
	munmap(p + len, (size_t)(raw + BIG_ALIGN - p));
	(void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused is fine */
	return p;
}

/* One block kept after its free for the next dptp_big_alloc: touching a
 * page for the first time costs a fault (3-12 us each on a virtual
 * machine with shadow page tables), so the checks, which run one after
 * another, reuse the pages an earlier check touched instead of faulting
 * in fresh ones. `out` is the block while it is handed out. */
static struct {
	pthread_mutex_t lock;
	char *kept, *out;
	size_t kept_len, out_len, dirty; /* dirty: bytes of kept that may be non-zero */
} big = { .lock = PTHREAD_MUTEX_INITIALIZER };

void *dptp_big_alloc(size_t bytes)
{
	size_t len = big_len(bytes ? bytes : 1);
	char *p = NULL;
	pthread_mutex_lock(&big.lock);
	if (big.kept && !big.out) {
		p = big.kept;
		if (big.kept_len < len) {
			/* too small: a fresh aligned block (huge pages need the
			 * alignment that growing in place would lose) */
			munmap(p, big.kept_len);
			big.kept = p = big_map(len);
			big.kept_len = p ? len : 0;
			big.dirty = 0;
		}
		if (p) {
			memset(p, 0, big.dirty < len ? big.dirty : len); /* zeroed, as promised */
			big.out = p;
			big.out_len = big.kept_len;
		}
	}
	pthread_mutex_unlock(&big.lock);
	return p ? p : big_map(len);
}

void dptp_big_free(void *p, size_t bytes)
{
	if (!p)
		return;
	pthread_mutex_lock(&big.lock);
	if (p == big.out) {
		big.out = NULL;
		big.dirty = big.out_len;
		pthread_mutex_unlock(&big.lock);
		return;
	}
	if (!big.kept) { /* the first one freed is kept */
		big.kept = p;
		big.kept_len = big.dirty = big_len(bytes ? bytes : 1);
		pthread_mutex_unlock(&big.lock);
		return;
	}
	pthread_mutex_unlock(&big.lock);
	munmap(p, big_len(bytes ? bytes : 1));
}

int dptp_fd_io(int fd, bool wr, void *p, size_t bytes, size_t off)
{
	char *q = p;
	while (bytes) {
		ssize_t k = wr ? pwrite(fd, q, bytes, (off_t)off) : pread(fd, q, bytes, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		q += k;
		off += (size_t)k;
		bytes -= (size_t)k;
	}
	return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void dptp_rm_tree(const char *dir)
{
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
