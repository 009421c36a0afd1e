/* Strict UTF-8 (see utf8.h). */
#include "base/utf8.h"

size_t dptp_utf8_next(const uint8_t *p, size_t n, unsigned flags, uint32_t *cp)
{
	static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
	size_t len;
	uint32_t c;
	if (n == 0)
		return 0;
	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	if ((p[0] & 0xe0) == 0xc0)
		len = 2, c = p[0] & 0x1fu;
	else if ((p[0] & 0xf0) == 0xe0)
		len = 3, c = p[0] & 0x0fu;
	else if ((p[0] & 0xf8) == 0xf0)
		len = 4, c = p[0] & 0x07u;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3fu);
	}
	if (c < min[len] || c > 0x10ffff)
		return 0;
	if (c >= 0xd800 && c <= 0xdfff && !(flags & DPTP_UTF8_SURROGATES))
		return 0;
	*cp = c;
	return len;
}

size_t dptp_utf8_invalid_len(const uint8_t *p, size_t n)
{
	uint8_t lo = 0x80, hi = 0xbf;
	size_t need, k = 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		need = 2;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		need = 3, lo = p[0] == 0xe0 ? 0xa0 : 0x80, hi = p[0] == 0xed ? 0x9f : 0xbf;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		need = 4, lo = p[0] == 0xf0 ? 0x90 : 0x80, hi = p[0] == 0xf4 ? 0x8f : 0xbf;
	else
		return 1;
	if (k < n && p[k] >= lo && p[k] <= hi)
		for (k++; k < need && k < n && (p[k] & 0xc0) == 0x80; k++)
			;
	return k;
}

bool dptp_utf8_valid(const uint8_t *p, size_t n, unsigned flags)
{
	uint32_t cp;
	for (size_t at = 0, k; at < n; at += k)
		if (!(k = dptp_utf8_next(p + at, n - at, flags, &cp)))
			return false;
	return true;
}
