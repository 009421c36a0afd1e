/* dptp-run entry point. */
#include "agent/dptp_run.h"

#include <stdio.h>

#include "cli/run_opts.h"
#include "audit/audit.h"
#include "agent/env.h"
#include "agent/supervise.h"

int dptp_run_main(int argc, char **argv)
{
	struct run_opts o;
	int rc;

	switch (run_opts_parse(&o, argc, argv, stdout, stderr)) {
	case RUN_OPTS_HELP:
		return 0;
	case RUN_OPTS_USAGE:
		return 2;
	case RUN_OPTS_OK:
		break;
	}
	struct dptp_err err = {0};
	if (audit_create(&o.audit, &o.audit_opts, &err) < 0) {
		fprintf(stderr, "dptp-run: error: %s\n", err.msg);
		run_opts_release(&o);
		return 2;
	}
	env_launcher_setup(&o, stderr);
	rc = supervise_run(&o);
	rc = audit_finish(o.audit, rc, stderr);
	audit_destroy(o.audit);
	run_opts_release(&o);
	return rc;
}
