/* libFuzzer: dptp-check's option parser (cli/options.c) on an argv made of
 * the input split at NUL bytes. It must return 0 or -EINVAL with a one-line
 * message, never crash, never read past an argument. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_argv.h"
#include "options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *argv[FUZZ_MAX_ARGS + 1], *copy[FUZZ_MAX_ARGS + 1];
	int argc = fuzz_argv_split(data, size, "dptp-check", argv, copy);
	struct dptp_options o;
	struct dptp_err err = {0};
	dptp_options_init(&o);
	int r = dptp_options_parse(&o, argc, argv, &err);
	if (r != 0 && r != -EINVAL)
		__builtin_trap();
	/* an error is one non-empty line; the message quotes the argument raw,
	 * so a newline inside an argument shows up in it (see HARDENING.md):
	 * checked only for inputs without one, or always with
	 * FUZZ_STRICT_MESSAGES=1 */
	if (r < 0 && (err.msg[0] == 0 ||
		      (strchr(err.msg, '\n') && (!memchr(data, '\n', size) || getenv("FUZZ_STRICT_MESSAGES")))))
		__builtin_trap();
	if (r == 0 && o.output)
		(void)strlen(o.output);
	fuzz_argv_free(copy);
	return 0;
}
