/* json.dumps strings (see json.h). */
#include "base/json.h"

#include "base/utf8.h"

void dptp_json_cp(struct dptp_buf *b, uint32_t cp)
{
	switch (cp) {
	case '"': dptp_buf_adds(b, "\\\""); return;
	case '\\': dptp_buf_adds(b, "\\\\"); return;
	case '\n': dptp_buf_adds(b, "\\n"); return;
	case '\r': dptp_buf_adds(b, "\\r"); return;
	case '\t': dptp_buf_adds(b, "\\t"); return;
	case '\b': dptp_buf_adds(b, "\\b"); return;
	case '\f': dptp_buf_adds(b, "\\f"); return;
	}
	if (cp >= 0x20 && cp < 0x7f) {
		dptp_buf_addc(b, (char)cp);
	} else if (cp < 0x10000) {
		dptp_buf_addf(b, "\\u%04x", (unsigned)cp);
	} else {
		cp -= 0x10000;
		dptp_buf_addf(b, "\\u%04x\\u%04x", 0xd800u | (unsigned)(cp >> 10), 0xdc00u | (unsigned)(cp & 0x3ff));
	}
}

void dptp_json_str(struct dptp_buf *b, const char *s, size_t n, unsigned flags)
{
	const uint8_t *p = (const uint8_t *)s;
	dptp_buf_addc(b, '"');
	for (size_t at = 0, k; at < n; at += k) {
		uint32_t cp;
		if ((k = dptp_utf8_next(p + at, n - at, 0, &cp))) {
			dptp_json_cp(b, cp);
		} else if (flags & DPTP_JSON_REPLACE) {
			k = dptp_utf8_invalid_len(p + at, n - at);
			dptp_json_cp(b, 0xfffd);
		} else {
			k = 1;
			dptp_json_cp(b, 0xdc00u | p[at]);
		}
	}
	dptp_buf_addc(b, '"');
}
