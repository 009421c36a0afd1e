/* What a worker runs and the environment it gets: torchrun's section B. */
#ifndef DPTP_LAUNCHER_ENV_H
#define DPTP_LAUNCHER_ENV_H

#include <stddef.h>
#include <stdio.h>

#include "cli/run_opts.h"
#include "rdzv/rendezvous.h"

struct worker_cmd {
	char *path;        /* resolved executable (PATH searched), owned */
	char **argv;       /* template argv, ${local_rank} not yet substituted; owned */
	size_t argc;
	char *entry_name;  /* failure report title: script, module or program; owned */
};

/* Builds the command: python3 -u script (PYTHON_EXEC honoured), -m, or
 * --no-python. */
int env_build_command(const struct run_opts *o, struct worker_cmd *cmd, struct dptp_err *err);
void env_command_release(struct worker_cmd *cmd);
/* torch's _get_logs_specs_class: is name an entry point of the group
 * torchrun.logs_specs? Asked of the workers' Python (at most 10 s). 1 yes,
 * 0 no, <0 it could not be asked (err says why). */
int env_logs_specs_known(const char *name, struct dptp_err *err);
/* argv for local_rank with string.Template.safe_substitute(local_rank=N)
 * applied to every argument. Caller frees with env_strv_free(). */
char **env_argv_for(const struct worker_cmd *cmd, unsigned local_rank);

/* Python string.Template.safe_substitute: $name and ${name} replaced when
 * name is one of keys, $$ -> $, everything else kept. Returns malloc'd. */
char *env_template_subst(const char *tmpl, const char *const *keys, const char *const *vals, size_t n);

struct worker_env_spec {
	unsigned local_rank, global_rank, role_rank;
	unsigned local_world_size;
	const struct rdzv_info *rdzv;
	const char *role;
	unsigned restart_count, max_restarts;
	const char *error_file; /* "" when log_dir is /dev/null */
	int virtual_local_rank;
	unsigned nproc_per_node;       /* > 1: OMP_NUM_THREADS=1 unless set */
	const char *signals_to_handle; /* TORCHELASTIC_SIGNALS_TO_HANDLE */
};

/* environ | the worker's torchrun variables, as a malloc'd NULL-terminated
 * array of malloc'd strings (PMIx_server_setup_fork may append to it). */
char **env_build(const struct worker_env_spec *spec);
void env_strv_free(char **v);

/* torchrun's OMP_NUM_THREADS warning (run.py L849-861), printed when
 * env_build will give the workers OMP_NUM_THREADS=1 (torchrun sets it in its
 * own environment; dptp-run passes it in the worker's, with
 * TORCHELASTIC_SIGNALS_TO_HANDLE, and leaves its own alone). */
void env_launcher_setup(const struct run_opts *o, FILE *errs);

#endif
