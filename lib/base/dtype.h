/* Element types of the data plane. */
#ifndef DPTP_LIB_DTYPE_H
#define DPTP_LIB_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dptp_dtype { DPTP_DTYPE_BF16, DPTP_DTYPE_FP16, DPTP_DTYPE_FP32 };

static inline size_t dptp_dtype_bytes(enum dptp_dtype d)
{
	return d == DPTP_DTYPE_FP32 ? 4 : 2;
}

/* "bf16", "fp16", "fp32" (the CLI and report spelling). */
static inline const char *dptp_dtype_name(enum dptp_dtype d)
{
	return d == DPTP_DTYPE_FP32 ? "fp32" : d == DPTP_DTYPE_FP16 ? "fp16" : "bf16";
}

static inline uint32_t dptp_f2u_(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float dptp_u2f_(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t dptp_f32_to_bf16(float f)
{
	uint32_t u = dptp_f2u_(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline float dptp_bf16_to_f32(uint16_t h) { return dptp_u2f_((uint32_t)h << 16); }

static inline uint16_t dptp_f32_to_f16(float f)
{
	uint32_t x = dptp_f2u_(f);
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

static inline float dptp_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;
	if (exp == 0) {
		if (mant == 0)
			return dptp_u2f_(sign);
		float v = (float)mant / 1024.0f / 16384.0f;
		return sign ? -v : v;
	}
	if (exp == 31)
		return dptp_u2f_(sign | 0x7f800000u | (mant << 13));
	return dptp_u2f_(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline float dptp_load_elt(const void *p, size_t i, enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: return ((const float *)p)[i];
	case DPTP_DTYPE_BF16: return dptp_bf16_to_f32(((const uint16_t *)p)[i]);
	case DPTP_DTYPE_FP16: return dptp_f16_to_f32(((const uint16_t *)p)[i]);
	}
	return 0;
}

static inline void dptp_store_elt(void *p, size_t i, float v, enum dptp_dtype dt)
{
	switch (dt) {
	case DPTP_DTYPE_FP32: ((float *)p)[i] = v; break;
	case DPTP_DTYPE_BF16: ((uint16_t *)p)[i] = dptp_f32_to_bf16(v); break;
	case DPTP_DTYPE_FP16: ((uint16_t *)p)[i] = dptp_f32_to_f16(v); break;
	}
}

/* Whole arrays, one loop per dtype (no branch per element): out[i] = p[i]. */
static inline void dptp_load_f32(float *out, const void *p, size_t n, enum dptp_dtype dt)
{
	const uint16_t *q = (const uint16_t *)p;
	switch (dt) {
	case DPTP_DTYPE_FP32: memcpy(out, p, n * sizeof(float)); break;
	case DPTP_DTYPE_BF16: for (size_t i = 0; i < n; i++) out[i] = dptp_bf16_to_f32(q[i]); break;
	case DPTP_DTYPE_FP16: for (size_t i = 0; i < n; i++) out[i] = dptp_f16_to_f32(q[i]); break;
	}
}

/* p[i] = in[i], rounded to dt as dptp_store_elt rounds. */
static inline void dptp_store_f32(void *p, const float *in, size_t n, enum dptp_dtype dt)
{
	uint16_t *q = (uint16_t *)p;
	switch (dt) {
	case DPTP_DTYPE_FP32: memcpy(p, in, n * sizeof(float)); break;
	case DPTP_DTYPE_BF16: for (size_t i = 0; i < n; i++) q[i] = dptp_f32_to_bf16(in[i]); break;
	case DPTP_DTYPE_FP16: for (size_t i = 0; i < n; i++) q[i] = dptp_f32_to_f16(in[i]); break;
	}
}

/* acc[i] += p[i] (in fp32), the step of a sum in a fixed order. */
static inline void dptp_add_f32(float *acc, const void *p, size_t n, enum dptp_dtype dt)
{
	const uint16_t *q = (const uint16_t *)p;
	switch (dt) {
	case DPTP_DTYPE_FP32: for (size_t i = 0; i < n; i++) acc[i] += ((const float *)p)[i]; break;
	case DPTP_DTYPE_BF16: for (size_t i = 0; i < n; i++) acc[i] += dptp_bf16_to_f32(q[i]); break;
	case DPTP_DTYPE_FP16: for (size_t i = 0; i < n; i++) acc[i] += dptp_f16_to_f32(q[i]); break;
	}
}

#endif
