/* libFuzzer: the pure TCPStore request scanner (lib/wire/tcpstore_proto.c).
 * Checks its contract on every input, under the default limits and under
 * tiny ones taken from the first byte:
 *   1  -> 0 < *out <= len, and every prefix of the frame is "need more"
 *         with a need that never shrinks and never passes the frame;
 *   0  -> *out > len;
 *   <0 -> only -EPROTO or -EMSGSIZE.
 * Huge length prefixes must be refused from the prefix alone (no allocation:
 * the scanner is pure), which the RSS check of run.sh's long run measures. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/tcpstore.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *p, size_t n, const struct dptp_tcpstore_limits *lim)
{
	size_t out = 0;
	int r = dptp_tcpstore_scan_request(p, n, lim, &out);
	if (r == 1) {
		if (out == 0 || out > n)
			__builtin_trap();
		/* the same frame alone is complete with the same length */
		size_t out2 = 0;
		if (dptp_tcpstore_scan_request(p, out, lim, &out2) != 1 || out2 != out)
			__builtin_trap();
		/* a few strict prefixes ask for more, never for more than the frame */
		size_t step = out / 8 + 1;
		for (size_t k = 0; k < out; k += step) {
			size_t need = 0;
			int rk = dptp_tcpstore_scan_request(p, k, lim, &need);
			if (rk != 0 || need <= k || need > out)
				__builtin_trap();
		}
	} else if (r == 0) {
		if (out <= n)
			__builtin_trap();
	} else if (r != -EPROTO && r != -EMSGSIZE) {
		__builtin_trap();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check(data, size, NULL);
	if (size > 0) {
		struct dptp_tcpstore_limits small = {
			.max_key = 1 + (data[0] & 15),
			.max_value = 1 + (data[0] >> 4),
			.max_keys = 1 + (data[0] & 3),
		};
		check(data + 1, size - 1, &small);
	}
	return 0;
}
