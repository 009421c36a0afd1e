/* Element types of the data plane. */
#ifndef DPTP_LIB_DTYPE_H
#define DPTP_LIB_DTYPE_H

#include <stddef.h>

enum dptp_dtype { DPTP_DTYPE_BF16, DPTP_DTYPE_FP16, DPTP_DTYPE_FP32 };

static inline size_t dptp_dtype_bytes(enum dptp_dtype d)
{
	return d == DPTP_DTYPE_FP32 ? 4 : 2;
}

#endif
