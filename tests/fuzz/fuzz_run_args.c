/* libFuzzer: dptp-run's torchrun command line (launcher/cli/run_opts.c) on an argv
 * made of the input split at NUL bytes. Help and usage go to /dev/null. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli/run_opts.h"
#include "fuzz_argv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!devnull)
		devnull = fopen("/dev/null", "w");
	char *argv[FUZZ_MAX_ARGS + 1], *copy[FUZZ_MAX_ARGS + 1];
	int argc = fuzz_argv_split(data, size, "dptp-run", argv, copy);
	struct run_opts o;
	memset(&o, 0, sizeof(o));
	enum run_opts_result r = run_opts_parse(&o, argc, argv, devnull, devnull);
	if (r != RUN_OPTS_OK && r != RUN_OPTS_HELP && r != RUN_OPTS_USAGE)
		__builtin_trap();
	if (r == RUN_OPTS_OK) {
		for (unsigned lr = 0; lr < 16; lr++) {
			(void)run_opts_std_for(&o.redirects, lr);
			(void)run_opts_std_for(&o.tee, lr);
		}
	}
	run_opts_release(&o);
	fuzz_argv_free(copy);
	return 0;
}
