#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int dptp_err_set(struct dptp_err *err, int rc, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
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
}

double dptp_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dptp_parse_u64(const char *s, uint64_t min, uint64_t max, bool allow_suffix, uint64_t *out)
{
	if (!s || !*s || *s == '-' || *s == '+' || *s == ' ' || *s == '\t')
		return -EINVAL;
	errno = 0;
	char *end = NULL;
	unsigned long long v = strtoull(s, &end, 0);
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

int dptp_parse_double(const char *s, double min, double max, double *out)
{
	if (!s || !*s || *s == ' ' || *s == '\t')
		return -EINVAL;
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

uint64_t dptp_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
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

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t dptp_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float dptp_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dptp_f32_to_f16(float f)
{
	uint32_t x = f2u(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t mant = x & 0x007fffffu;
	int exp = (int)((x >> 23) & 0xff);
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
	int e = exp - 127 + 15;
	if (e >= 0x1f)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		mant |= 0x00800000u;
		unsigned shift = (unsigned)(14 - e);
		uint32_t half = 1u << (shift - 1);
		uint32_t r = mant >> shift;
		uint32_t rem = mant & ((1u << shift) - 1);
		if (rem > half || (rem == half && (r & 1u)))
			r++;
		return (uint16_t)(sign | r);
	}
	uint32_t r = ((uint32_t)e << 10) | (mant >> 13);
	uint32_t rem = mant & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
		r++;
	return (uint16_t)(sign | r);
}

float dptp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;
	if (exp == 0) {
		if (mant == 0)
			return u2f(sign);
		float v = (float)mant / 1024.0f / 16384.0f;
		return sign ? -v : v;
	}
	if (exp == 31)
		return u2f(sign | 0x7f800000u | (mant << 13));
	return u2f(sign | ((exp + 112) << 23) | (mant << 13));
}
