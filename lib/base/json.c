/* json.dumps strings (see json.h). */
#include "base/json.h"

#include "base/utf8.h"

#include <string.h>

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

/* four hex digits at p (p + 4 <= end), or -1 */
static long hex4(const char *p, const char *end)
{
	long v = 0;
	if (end - p < 4)
		return -1;
	for (int i = 0; i < 4; i++) {
		char c = p[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		v = v << 4 | d;
	}
	return v;
}

static void put_utf8(struct dptp_buf *b, uint32_t cp)
{
	uint8_t u[4];
	size_t n;
	if (cp < 0x80) {
		u[0] = (uint8_t)cp, n = 1;
	} else if (cp < 0x800) {
		u[0] = (uint8_t)(0xc0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 0x3f)), n = 2;
	} else if (cp < 0x10000) {
		u[0] = (uint8_t)(0xe0 | cp >> 12), u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
		u[2] = (uint8_t)(0x80 | (cp & 0x3f)), n = 3;
	} else {
		u[0] = (uint8_t)(0xf0 | cp >> 18), u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
		u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (uint8_t)(0x80 | (cp & 0x3f)), n = 4;
	}
	dptp_buf_add(b, u, n);
}

const char *dptp_json_read_str(const char *p, const char *end, struct dptp_buf *out, unsigned flags)
{
	static const char esc[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
	if (p >= end || *p != '"')
		return NULL;
	for (p++; p < end && *p != '"';) {
		const char *run = p;
		while (p < end && *p != '"' && *p != '\\')
			p++;
		dptp_buf_add(out, run, (size_t)(p - run));
		if (p >= end || *p == '"')
			break;
		if (++p >= end)
			return NULL;
		if (*p != 'u') {
			const char *e = *p ? strchr(esc, *p) : NULL;
			if (!e || (size_t)(e - esc) % 2)
				return NULL;
			dptp_buf_addc(out, e[1]);
			p++;
			continue;
		}
		long cp = hex4(p + 1, end), lo;
		if (cp < 0)
			return NULL;
		p += 5;
		if (cp >= 0xd800 && cp < 0xdc00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u' &&
		    (lo = hex4(p + 2, end)) >= 0xdc00 && lo < 0xe000) {
			cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			p += 6;
		} else if (cp >= 0xd800 && cp < 0xe000 && !(flags & DPTP_JSON_SURROGATEPASS)) {
			cp = 0xfffd;
		}
		put_utf8(out, (uint32_t)cp);
	}
	if (p >= end || out->oom)
		return NULL;
	return p + 1;
}
