/* dptp-run command line: torchrun 2.11's options, spellings, PET_* defaults
 * and validation. Parsing follows argparse: --opt=v and --opt v, unique
 * prefixes of long options, everything after the script passed verbatim. */
#ifndef DPTP_LAUNCHER_RUN_OPTS_H
#define DPTP_LAUNCHER_RUN_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "audit/audit.h"
#include "base/util.h"

#define RUN_MAX_SIGNALS 32
#define RUN_STD_MAP_MAX 10 /* argparse's regex allows single-digit ranks */

/* torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both; one value or a map. */
struct run_opts_std {
	bool is_map;
	int all;
	int map[RUN_STD_MAP_MAX]; /* -1: rank not listed (Std.NONE) */
};

struct run_opts {
	unsigned min_nodes, max_nodes;
	const char *nproc_raw;
	unsigned nproc;
	const char *rdzv_backend;
	const char *rdzv_endpoint;
	const char *rdzv_id;
	const char *rdzv_conf;
	unsigned rdzv_timeout; /* static "timeout", seconds */
	/* c10d's --rdzv-conf keys (torch's defaults), seconds; is_host -1
	 * when not given */
	struct {
		unsigned join, last_call, close, heartbeat, keep_alive_interval, keep_alive_max_attempt, read;
		int is_host;
	} c10d;
	bool standalone;
	unsigned max_restarts;
	double monitor_interval;
	const char *start_method;
	const char *event_log_handler;
	const char *role;
	bool module, no_python, run_path, virtual_local_rank;
	const char *log_dir; /* NULL: a fresh /tmp/torchelastic_XXXXXXXX */
	struct run_opts_std redirects, tee;
	const char *local_ranks_filter_raw;
	int *local_ranks_filter; /* NULL when unset */
	size_t nlocal_ranks_filter;
	const char *dup_stdout_filters, *dup_stderr_filters;
	unsigned node_rank;
	const char *master_addr; /* brackets of an IPv6 address removed */
	char master_addr_buf[256];
	unsigned master_port;
	const char *local_addr;
	const char *logs_specs;
	const char *numa_binding;
	const char *signals_to_handle;
	int signals[RUN_MAX_SIGNALS];
	size_t nsignals;
	const char *script;
	char **script_args; /* borrowed from argv (argparse's "--" removed in place) */
	int nscript_args;
	struct audit_opts audit_opts; /* --audit* as given */
	struct audit *audit;          /* dptp_run.c's, NULL without --audit */
};

enum run_opts_result {
	RUN_OPTS_OK = 0,
	RUN_OPTS_HELP = 1,  /* help printed: exit 0 */
	RUN_OPTS_USAGE = 2, /* usage + error printed: exit 2 */
};

/* Parses argv into o (which borrows argv and the environment; release with
 * run_opts_release()). Reads PET_* from getenv. Writes help to out and
 * usage errors to errs. */
enum run_opts_result run_opts_parse(struct run_opts *o, int argc, char **argv, FILE *out, FILE *errs);
void run_opts_release(struct run_opts *o);

/* Resolves --nproc-per-node's value (N, cpu, gpu, auto). Returns 0 or a
 * negative errno with a message in err. */
int run_opts_nproc_resolve(const char *v, unsigned *out, struct dptp_err *err);
/* Parses torchrun's Std value or map ("3", "0:1,1:2"). */
int run_opts_std_parse(const char *v, struct run_opts_std *s, struct dptp_err *err);
/* Std flags for a local rank. */
int run_opts_std_for(const struct run_opts_std *s, unsigned local_rank);
/* Parses "host[:port]" ("[v6]:port" too). port is -1 when absent. host is
 * written NUL-terminated into host (size hostlen). */
int run_opts_parse_endpoint(const char *ep, char *host, size_t hostlen, int *port, struct dptp_err *err);
/* Signal name (SIGTERM) to number; -1 when unknown. */
int run_opts_signal_from_name(const char *name);

/* What dptp-run reads from the environment besides PET_*: the grace
 * period after the closing signal (DPTP_RUN_STOP_TIMEOUT, else newer
 * torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT in whole seconds, else 30 s),
 * the exit barrier's wait (DPTP_RUN_EXIT_BARRIER_TIMEOUT, else torch's
 * 300 s) and torch's LOGLEVEL (INFO or DEBUG: the agent's info lines). An
 * empty variable counts as unset. */
struct run_opts_env {
	double stop_timeout;
	double barrier_timeout;
	bool info_log;
};

/* Reads them into e. Returns 0, or -EINVAL with *bad set to the name of
 * the variable whose value is invalid. */
int run_opts_env_read(struct run_opts_env *e, const char **bad);

void run_opts_print_help(FILE *f);
void run_opts_print_usage(FILE *f);

#endif
