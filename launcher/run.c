/* dptp-run entry point. */
#include "run.h"

#include <stdio.h>

#include "args.h"
#include "env.h"
#include "supervise.h"

int dptp_run_main(int argc, char **argv)
{
	struct run_opts o;
	int rc;

	switch (run_args_parse(&o, argc, argv, stdout, stderr)) {
	case RUN_ARGS_HELP:
		return 0;
	case RUN_ARGS_USAGE:
		return 2;
	case RUN_ARGS_OK:
		break;
	}
	env_launcher_setup(&o, stderr);
	rc = supervise_run(&o);
	run_opts_release(&o);
	return rc;
}
