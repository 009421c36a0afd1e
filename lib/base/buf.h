/* A growable byte buffer, written once for every writer that builds bytes
 * before it sends or stores them (TCPStore frames, the c10d state's pickle,
 * cross-node frames, JSON text, template substitution). Zero it to start
 * ({0}); an append that cannot allocate sets oom, and every later append
 * does nothing, so a writer checks once, at the end. The bytes are always
 * followed by a NUL (not counted in len) once anything was appended. */
#ifndef DPTP_BASE_BUF_H
#define DPTP_BASE_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dptp_buf {
	uint8_t *buf;   /* owned: dptp_buf_release() or dptp_buf_detach() */
	size_t len, cap;
	bool oom;
};

/* Room for n more bytes (and the NUL) at buf + len; false when out of
 * memory (oom is then set). */
bool dptp_buf_reserve(struct dptp_buf *b, size_t n);
/* Appends n bytes of p (p may be NULL when n is 0). */
void dptp_buf_add(struct dptp_buf *b, const void *p, size_t n);
void dptp_buf_addc(struct dptp_buf *b, char c);
void dptp_buf_adds(struct dptp_buf *b, const char *s);
void dptp_buf_addf(struct dptp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The bytes as a malloc'd, NUL-terminated string now the caller's (an
 * empty one when nothing was appended), *len their count when len is not
 * NULL; NULL when an append failed. b is zeroed either way. */
char *dptp_buf_detach(struct dptp_buf *b, size_t *len);
/* Frees the bytes and zeroes b; NULL-safe. */
void dptp_buf_release(struct dptp_buf *b);

#endif
