/* JSON strings as Python's json.dumps writes them (ensure_ascii, the
 * default): torch's readers compare the bytes (a c10d node's role_info, the
 * agent's events), so these are exactly Python's: the short escapes \" \\
 * \n \r \t \b \f, every other byte outside 0x20..0x7e as \uXXXX in
 * lower-case hex, a code point above the BMP as a surrogate pair, a lone
 * surrogate as itself. Bytes are decoded as Python decodes its command
 * line and environment (UTF-8, surrogateescape): a byte that is not part
 * of strict UTF-8 is U+DC80..U+DCFF; with DPTP_JSON_REPLACE each maximal
 * invalid piece is one U+FFFD instead, as errors="replace" reads a file. */
#ifndef DPTP_BASE_JSON_H
#define DPTP_BASE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

enum { DPTP_JSON_REPLACE = 1 << 0, DPTP_JSON_SURROGATEPASS = 1 << 1 };

/* One code point (a lone surrogate included) inside a string. */
void dptp_json_cp(struct dptp_buf *b, uint32_t cp);
/* n bytes of s decoded (see above), quoted. */
void dptp_json_str(struct dptp_buf *b, const char *s, size_t n, unsigned flags);

/* The JSON string at p (p < end, *p == '"') as json.loads reads it, its
 * value appended to out in UTF-8: the escapes \" \\ \/ \b \f \n \r \t and
 * \uXXXX (either case), a \u surrogate pair as one code point, a lone
 * surrogate as U+FFFD or, with DPTP_JSON_SURROGATEPASS, as its own three
 * bytes (errors="surrogatepass"). Other bytes are copied as they are
 * (control bytes too: json.loads(strict=False)). Returns the byte after
 * the closing quote; NULL for an unknown escape, a bad \u, a missing
 * closing quote, or out of memory. */
const char *dptp_json_read_str(const char *p, const char *end, struct dptp_buf *out, unsigned flags);

#endif
