/* UTF-8 decoding as Python's strict codec does it: no overlong forms, no
 * code point past U+10FFFF, no stray or missing continuation bytes, and
 * surrogates (U+D800..U+DFFF) only where the caller allows them (pickle's
 * BINUNICODE reads with errors="surrogatepass"). Pure, no I/O. */
#ifndef DPTP_BASE_UTF8_H
#define DPTP_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { DPTP_UTF8_SURROGATES = 1 << 0 };

/* Length of the UTF-8 sequence at p[0..n) (1-4) with its code point in *cp,
 * or 0 when the bytes there are not one (n == 0 included). */
size_t dptp_utf8_next(const uint8_t *p, size_t n, unsigned flags, uint32_t *cp);
/* Where dptp_utf8_next finds no sequence at p (n >= 1), the bytes Python's
 * decoder reports as one error there (errors="replace" makes them one
 * U+FFFD): the longest start of a strict sequence, at least 1 byte. */
size_t dptp_utf8_invalid_len(const uint8_t *p, size_t n);
/* Whether p[0..n) is UTF-8 from end to end. */
bool dptp_utf8_valid(const uint8_t *p, size_t n, unsigned flags);

#endif
