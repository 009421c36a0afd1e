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

enum { DPTP_JSON_REPLACE = 1 << 0 };

/* One code point (a lone surrogate included) inside a string. */
void dptp_json_cp(struct dptp_buf *b, uint32_t cp);
/* n bytes of s decoded (see above), quoted. */
void dptp_json_str(struct dptp_buf *b, const char *s, size_t n, unsigned flags);

#endif
