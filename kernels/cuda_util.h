/* Internal to the kernels .cu files: CUDA error -> negative errno + message. C++ only. */
#ifndef DPTP_KERNELS_CUDA_UTIL_H
#define DPTP_KERNELS_CUDA_UTIL_H

#include <cuda_runtime.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels.h"

static inline int dptp_cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return 0;
	case cudaErrorMemoryAllocation: return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInitializationError: return -ENODEV;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevice: return -EINVAL;
	case cudaErrorNotSupported: return -EOPNOTSUPP;
	default: return -EIO;
	}
}

static inline int dptp_kerr(struct dptp_err *err, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline int dptp_kerr(struct dptp_err *err, int rc, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* Returns 0 on cudaSuccess, else -errno with "<what>: <string> (<name>)" in err. */
static inline int dptp_cuda_check(cudaError_t e, struct dptp_err *err, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	return dptp_kerr(err, dptp_cuda_errno(e), "%s: %s (%s)", what, cudaGetErrorString(e),
			 cudaGetErrorName(e));
}

#define DPTP_CU_TRY(call, err, what)                                          \
	do {                                                                  \
		int dptp_cu_rc_ = dptp_cuda_check((call), (err), (what));      \
		if (dptp_cu_rc_ < 0)                                          \
			return dptp_cu_rc_;                                   \
	} while (0)

#endif
