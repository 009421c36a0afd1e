/* Small shared helpers: error buffers, clocks, strict number parsing.
 * lib/ never prints and never exits; functions that can fail for a reason a
 * user should read take a struct dptp_err and append one complete message. */
#ifndef DPTP_LIB_UTIL_H
#define DPTP_LIB_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DPTP_ERR_MAX 1024

/* A message buffer; zero-initialise it ({0}). Untouched on success. */
struct dptp_err {
	char msg[DPTP_ERR_MAX];
};

/* Sets err->msg (printf-style); err may be NULL. Returns rc unchanged so
 * callers can write `return dptp_err_set(err, -EINVAL, "...")`. */
int dptp_err_set(struct dptp_err *err, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prepends "<prefix>: " to an existing message. */
void dptp_err_prefix(struct dptp_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Keeps the first problem of a sequence that must run to its end (lockstep
 * collectives): records nrc/nerr in *rc/err only when nothing failed yet. */
void dptp_err_keep(int *rc, struct dptp_err *err, int nrc, const struct dptp_err *nerr);

#define DPTP_TRY(expr) do { int dptp_try_rc_ = (expr); if (dptp_try_rc_ < 0) return dptp_try_rc_; } while (0)
#define DPTP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The host loops over megabytes (dtype conversions, sums, the reference
 * norm): compiled twice on x86-64, for AVX2 and the baseline, the CPU
 * picks at load time. AVX2 without FMA: a * b + c stays two roundings,
 * the same results on every CPU. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define DPTP_HOT __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef DPTP_HOT
#define DPTP_HOT
#endif

/* Monotonic seconds. */
double dptp_now(void);

/* Strict unsigned parse: decimal digits only, as torch reads numbers
 * ("010" is 10; "0x8", a sign, blanks and trailing junk are refused),
 * optional K/M/G suffix (powers of 1024) when allow_suffix. Range [min,max].
 * Returns 0 or -EINVAL / -ERANGE. */
int dptp_parse_u64(const char *s, uint64_t min, uint64_t max, bool allow_suffix, uint64_t *out);
/* Strict double parse: decimal (no hex float), finite, within [min,max]. */
int dptp_parse_double(const char *s, double min, double max, double *out);

/* A host as getaddrinfo takes it: "[::1]" (the URL form torchrun users
 * write for IPv6) becomes "::1" in buf; anything else is returned as is. */
const char *dptp_host_unbracket(const char *host, char *buf, size_t len);

/* Deterministic 64-bit mixing (splitmix64), used for inputs and names. */
static inline uint64_t dptp_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Reads the whole getrandom(2) entropy into buf. Returns 0 or -errno. */
int dptp_entropy(void *buf, size_t len);

/* Zeroed memory for large buffers, offered to the kernel for transparent
 * huge pages (where it takes them, a buffer costs one page fault per 2
 * MiB instead of 512). One freed block is kept and handed out again
 * (replaced by a larger one where needed), so that checks that run one
 * after another reuse pages already faulted in. NULL when out of memory. Free
 * with dptp_big_free(p, the same bytes). */
void *dptp_big_alloc(size_t bytes);
void dptp_big_free(void *p, size_t bytes);

/* All of bytes at offset off of file fd, written from p (wr) or read into
 * it, through EINTR and short transfers: 0, -errno, or -EIO where the file
 * ends first. What the data planes move through shared memory goes this
 * way: the kernel copies through its own mapping of the pages, so no
 * process takes a fault per 4 KiB page of a peer's memory (on a virtual
 * machine with shadow page tables a first write through a fresh mapping
 * costs 5.5 us a page, a read 0.9 us; pwrite 0.2 us a page, measured). */
int dptp_fd_io(int fd, bool wr, void *p, size_t bytes, size_t off);

/* Removes a folder and everything in it, ignoring errors (shutil.rmtree). */
void dptp_rm_tree(const char *dir);

/* fp16/bf16 <-> float (round to nearest even) live in dtype.h, inline. */
#include "base/dtype.h"

#endif
