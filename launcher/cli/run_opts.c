/* dptp-run command line (see run_opts.h). */
#include "cli/run_opts.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum opt_id {
	O_HELP, O_NNODES, O_NPROC, O_RDZV_BACKEND, O_RDZV_ENDPOINT, O_RDZV_ID,
	O_RDZV_CONF, O_STANDALONE, O_MAX_RESTARTS, O_MONITOR_INTERVAL,
	O_START_METHOD, O_EVENT_LOG_HANDLER, O_ROLE, O_MODULE, O_NO_PYTHON,
	O_RUN_PATH, O_LOG_DIR, O_REDIRECTS, O_TEE, O_LOCAL_RANKS_FILTER,
	O_DUP_STDOUT, O_DUP_STDERR, O_NODE_RANK, O_MASTER_ADDR, O_MASTER_PORT,
	O_LOCAL_ADDR, O_LOGS_SPECS, O_NUMA_BINDING, O_SIGNALS, O_VIRTUAL_LOCAL_RANK,
	O_AUDIT, O_AUDIT_LAYOUT, O_AUDIT_OUTPUT, O_AUDIT_FORMAT, O_AUDIT_HANG, O_AUDIT_KEEP,
	O_COUNT
};

enum opt_flags {
	OPT_VALUE = 1 << 0, /* takes one argument */
	OPT_PET = 1 << 1,   /* default from PET_<DEST> */
};

struct opt_def {
	const char *dest;
	const char *names[3]; /* in argparse's order; short first when present */
	unsigned flags;
	const char *dflt;
	const char *const *choices;
	const char *help;     /* --help's text, wrapped as argparse does */
};

static const char *const start_methods[] = {"spawn", "fork", "forkserver", NULL};
static const char *const numa_modes[] = {"node", "socket", "exclusive", "core-complex", NULL};

#define V (OPT_VALUE | OPT_PET)
static const struct opt_def opts[O_COUNT] = {
	[O_HELP] = {"help", {"-h", "--help"}, 0, NULL, NULL,
		"show this help message and exit"},
	[O_NNODES] = {"nnodes", {"--nnodes"}, V, "1:1", NULL,
		"Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes> (elastic: c10d)."},
	[O_NPROC] = {"nproc_per_node", {"--nproc-per-node", "--nproc_per_node"}, V, "1", NULL,
		"Number of workers per node; supported values: [auto, cpu, gpu, int]."},
	[O_RDZV_BACKEND] = {"rdzv_backend", {"--rdzv-backend", "--rdzv_backend"}, V, "static", NULL,
		"Rendezvous backend (static, c10d; etcd, etcd-v2 on a single node only)."},
	[O_RDZV_ENDPOINT] = {"rdzv_endpoint", {"--rdzv-endpoint", "--rdzv_endpoint"}, V, "", NULL,
		"Rendezvous backend endpoint; usually in form <host>:<port>."},
	[O_RDZV_ID] = {"rdzv_id", {"--rdzv-id", "--rdzv_id"}, V, "none", NULL,
		"User-defined group id (TORCHELASTIC_RUN_ID)."},
	[O_RDZV_CONF] = {"rdzv_conf", {"--rdzv-conf", "--rdzv_conf"}, V, "", NULL,
		"Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...)."},
	[O_STANDALONE] = {"standalone", {"--standalone"}, OPT_PET, NULL, NULL,
		"Single-node job on a free port with a random run id; --rdzv-backend, --rdzv-endpoint, --rdzv-id are ignored."},
	[O_MAX_RESTARTS] = {"max_restarts", {"--max-restarts", "--max_restarts"}, V, "0", NULL,
		"Maximum number of worker group restarts before failing."},
	[O_MONITOR_INTERVAL] = {"monitor_interval", {"--monitor-interval", "--monitor_interval"}, V, "0.1", NULL,
		"Interval, in seconds, of the safety-net poll of the workers (exits are seen at once)."},
	[O_START_METHOD] = {"start_method", {"--start-method", "--start_method"}, V, "spawn", start_methods,
		"Accepted; only affects Python function entrypoints."},
	[O_EVENT_LOG_HANDLER] = {"event_log_handler", {"--event-log-handler", "--event_log_handler"}, V, "null", NULL,
		"null (default), dynamic_rendezvous (also silent) or console: the agent's events, one JSON line each on stderr, as torchrun's console handler prints them."},
	[O_ROLE] = {"role", {"--role"}, V, "default", NULL,
		"User-defined role for the workers."},
	[O_MODULE] = {"module", {"-m", "--module"}, OPT_PET, NULL, NULL,
		"Run the script as a Python module (python -u -m)."},
	[O_NO_PYTHON] = {"no_python", {"--no-python", "--no_python"}, OPT_PET, NULL, NULL,
		"Execute the training script directly instead of with python."},
	[O_RUN_PATH] = {"run_path", {"--run-path", "--run_path"}, OPT_PET, NULL, NULL,
		"Run the script by runpy.run_path under an @record-style handler: its traceback is in the failure report."},
	[O_LOG_DIR] = {"log_dir", {"--log-dir", "--log_dir"}, V, NULL, NULL,
		"Base directory for log files; a job-level sub-directory <rdzv_id>_<random> is created in it."},
	[O_REDIRECTS] = {"redirects", {"-r", "--redirects"}, V, "0", NULL,
		"Redirect std streams into a log file in the log directory (e.g. [-r 3] redirects both stdout+stderr for all workers, [-r 0:1,1:2] redirects stdout for local rank 0 and stderr for local rank 1)."},
	[O_TEE] = {"tee", {"-t", "--tee"}, V, "0", NULL,
		"Tee std streams into a log file and also to console (see --redirects for format)."},
	[O_LOCAL_RANKS_FILTER] = {"local_ranks_filter", {"--local-ranks-filter", "--local_ranks_filter"}, V, "", NULL,
		"Only show logs from specified local ranks in console (e.g. 0,1,2); log files are still written."},
	[O_DUP_STDOUT] = {"duplicate_stdout_filters", {"--duplicate-stdout-filters", "--duplicate_stdout_filters"}, V, NULL, NULL,
		"Copy each tee'd stdout line that contains any of these comma-separated strings (',,' is a literal comma; an empty string matches every line), with its console prefix, to filtered_stdout.log in the attempt's log directory."},
	[O_DUP_STDERR] = {"duplicate_stderr_filters", {"--duplicate-stderr-filters", "--duplicate_stderr_filters"}, V, NULL, NULL,
		"The same for tee'd stderr lines, into filtered_stderr.log."},
	[O_NODE_RANK] = {"node_rank", {"--node-rank", "--node_rank"}, V, "0", NULL,
		"Rank of the node for multi-node distributed training."},
	[O_MASTER_ADDR] = {"master_addr", {"--master-addr", "--master_addr"}, V, "127.0.0.1", NULL,
		"Address of the master node (rank 0), static rendezvous only (MASTER_ADDR)."},
	[O_MASTER_PORT] = {"master_port", {"--master-port", "--master_port"}, V, "29500", NULL,
		"Port on the master node, static rendezvous only (MASTER_PORT)."},
	[O_LOCAL_ADDR] = {"local_addr", {"--local-addr", "--local_addr"}, V, NULL, NULL,
		"Address of the local node; defaults to its FQDN."},
	[O_LOGS_SPECS] = {"logs_specs", {"--logs-specs", "--logs_specs"}, OPT_VALUE, NULL, NULL,
		"A Python entry point, not loaded: warned about once; the default log layout is used."},
	[O_NUMA_BINDING] = {"numa_binding", {"--numa-binding", "--numa_binding"}, OPT_VALUE, NULL, numa_modes,
		"Bind each worker to CPUs near its GPU (CUDA device LOCAL_RANK): the CPUs of the GPU's NUMA node, of its socket, an exclusive share of the node's cores, or one last-level-cache group; as torch/numa/binding.py."},
	[O_SIGNALS] = {"signals_to_handle", {"--signals-to-handle", "--signals_to_handle"}, V, "SIGTERM,SIGINT,SIGHUP,SIGQUIT", NULL,
		"Comma-separated list of signals to handle and forward to the workers. Default: SIGTERM,SIGINT,SIGHUP,SIGQUIT."},
	[O_VIRTUAL_LOCAL_RANK] = {"virtual_local_rank", {"--virtual-local-rank", "--virtual_local_rank"}, OPT_PET, NULL, NULL,
		"LOCAL_RANK=0 for every worker and CUDA_VISIBLE_DEVICES narrowed to its own device."},
	/* dptp's own: the audit (launcher/audit/audit.c) */
	[O_AUDIT] = {"audit", {"--audit"}, 0, NULL, NULL,
		"Record the workers' torch.distributed calls, groups, sockets, shared memory and devices, and report the DP x TP bug family found in them per DP replica after the job (exit 1 on a finding, 5 when not everything was recorded)."},
	[O_AUDIT_LAYOUT] = {"audit_layout", {"--audit-layout"}, OPT_VALUE, NULL, NULL,
		"The job's DPxPPxTP in vLLM's rank order (e.g. 2x1x2); default: inferred from the groups the program creates."},
	[O_AUDIT_OUTPUT] = {"audit_output", {"--audit-output"}, OPT_VALUE, NULL, NULL,
		"Also write the audit report to this file (a regular file, checked before the job; - for stdout)."},
	[O_AUDIT_FORMAT] = {"audit_format", {"--audit-format"}, OPT_VALUE, NULL, NULL,
		"The report's format: text, json (default) or junit; without --audit-output the report goes to stdout."},
	[O_AUDIT_HANG] = {"audit_hang", {"--audit-hang"}, OPT_VALUE, NULL, NULL,
		"End the job when every live rank waits inside a collective and no record was written for this many seconds (default: the process group's timeout, torch's 1800 s for gloo, 600 s for NCCL); 0: never."},
	[O_AUDIT_KEEP] = {"audit_keep", {"--audit-keep"}, 0, NULL, NULL,
		"Keep the records' temporary folder after the report (without --log-dir it is removed)."},
};
#undef V

/* argparse's layout: "usage: dptp-run " then the options wrapped at 78
 * columns; in the help, invocations up to column 22 share the line with
 * their text, which is wrapped into columns 24-78. */
enum { HELP_WIDTH = 78, HELP_COL = 24 };

/* "NNODES", or "{a,b}" for choices. */
static void metavar(const struct opt_def *d, char *buf, size_t len)
{
	size_t off = 0;
	if (d->choices) {
		off += (size_t)snprintf(buf, len, "{");
		for (size_t i = 0; d->choices[i] && off < len; i++)
			off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "", d->choices[i]);
		if (off < len)
			snprintf(buf + off, len - off, "}");
		return;
	}
	for (size_t i = 0; d->dest[i] && i + 1 < len; i++, off++)
		buf[i] = (char)toupper((unsigned char)d->dest[i]);
	buf[off < len ? off : len - 1] = '\0';
}

/* Puts word at column *col, starting a new line indented by indent when it
 * would pass HELP_WIDTH. */
static void put_word(FILE *f, const char *w, size_t n, size_t *col, size_t indent)
{
	if (*col > indent && *col + 1 + n > HELP_WIDTH) {
		fprintf(f, "\n%*s", (int)indent, "");
		*col = indent;
	} else if (*col > indent) {
		fputc(' ', f);
		(*col)++;
	}
	fwrite(w, 1, n, f);
	*col += n;
}

void run_opts_print_usage(FILE *f)
{
	static const char head[] = "usage: dptp-run ";
	size_t col = sizeof(head) - 1, indent = col;
	char tok[160], mv[80];
	fputs(head, f);
	for (size_t i = 0; i < O_COUNT; i++) {
		const struct opt_def *d = &opts[i];
		metavar(d, mv, sizeof(mv));
		int n = snprintf(tok, sizeof(tok), (d->flags & OPT_VALUE) ? "[%s %s]" : "[%s]", d->names[0], mv);
		put_word(f, tok, (size_t)n, &col, indent);
	}
	fprintf(f, "\n%*straining_script ...\n", (int)indent, "");
}

void run_opts_print_help(FILE *f)
{
	char mv[80];
	run_opts_print_usage(f);
	fputs("\n"
		"torchrun-compatible launcher and PMIx server (dptp " DPTP_VERSION ")\n"
		"\n"
		"positional arguments:\n"
		"  training_script       Full path to the (single GPU) training program/script\n"
		"                        to be launched in parallel, followed by all the\n"
		"                        arguments for the training script.\n"
		"  training_script_args\n"
		"\n"
		"options:\n", f);
	for (size_t i = 0; i < O_COUNT; i++) {
		const struct opt_def *d = &opts[i];
		size_t col = 2;
		metavar(d, mv, sizeof(mv));
		fputs("  ", f);
		for (size_t k = 0; k < 3 && d->names[k]; k++)
			col += (size_t)fprintf(f, (d->flags & OPT_VALUE) ? "%s%s %s" : "%s%s", k ? ", " : "", d->names[k], mv);
		if (col <= HELP_COL - 2) {
			fprintf(f, "%*s", (int)(HELP_COL - col), "");
		} else {
			fprintf(f, "\n%*s", HELP_COL, "");
		}
		col = HELP_COL;
		for (const char *w = d->help; *w; ) {
			size_t n = strcspn(w, " ");
			put_word(f, w, n, &col, HELP_COL);
			w += n;
			w += strspn(w, " ");
		}
		fputc('\n', f);
	}
}

/* "argument --a/--a_b" as argparse names an option in messages. */
static void opt_label(enum opt_id id, char *buf, size_t len)
{
	size_t off = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < 3 && opts[id].names[i] && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "/" : "", opts[id].names[i]);
}

/* One line for each accepted option that dptp-run does not act on, so that
 * a torchrun command line never silently loses a setting. */
static void warn_unsupported(FILE *errs, const struct run_opts *o)
{
	if (!strncmp(o->rdzv_backend, "etcd", 4))
		fprintf(errs, "dptp-run: warning: --rdzv-backend=%s: there is no etcd client; this one-node job uses the static rendezvous (use c10d for several nodes)\n",
			o->rdzv_backend);
	fflush(errs);
}

struct parse {
	FILE *errs;
	const char *val[O_COUNT];
	bool given[O_COUNT];
	bool flag[O_COUNT];
	const char *unknown[64];
	size_t nunknown;
};

__attribute__((format(printf, 2, 3)))
static enum run_opts_result usage_error(FILE *errs, const char *fmt, ...)
{
	va_list ap;
	run_opts_print_usage(errs);
	fputs("dptp-run: error: ", errs);
	va_start(ap, fmt);
	vfprintf(errs, fmt, ap);
	va_end(ap);
	fputc('\n', errs);
	return RUN_OPTS_USAGE;
}

/* argparse: a token is an option when it starts with '-', is not "-", and is
 * not a negative number (no option looks like one). */
static bool looks_like_option(const char *s)
{
	if (s[0] != '-' || s[1] == '\0')
		return false;
	if (isdigit((unsigned char)s[1]) || (s[1] == '.' && isdigit((unsigned char)s[2]))) {
		char *end;
		errno = 0;
		(void)strtod(s, &end);
		if (*end == '\0')
			return false;
	}
	if (strchr(s, ' ') && s[1] == '-' && !strchr(s, '='))
		return false;
	return true;
}

/* Long option lookup: exact spelling, else the unique option that some
 * spelling starts with. Returns the id, -1 unknown, -2 ambiguous. */
static int find_long(const char *name, size_t len, char *amb, size_t amblen)
{
	int found = -1;
	size_t off = 0;
	bool ambiguous = false;
	for (int id = 0; id < O_COUNT; id++)
		for (size_t i = 0; i < 3 && opts[id].names[i]; i++)
			if (strlen(opts[id].names[i]) == len && !strncmp(opts[id].names[i], name, len))
				return id;
	for (int id = 0; id < O_COUNT; id++) {
		for (size_t i = 0; i < 3 && opts[id].names[i]; i++) {
			const char *n = opts[id].names[i];
			if (n[1] != '-' || strncmp(n, name, len))
				continue;
			if (off < amblen) /* past the end: keep counting matches, stop listing */
				off += (size_t)snprintf(amb + off, amblen - off, "%s%s", off ? ", " : "", n);
			/* argparse (Python 3.11) counts spellings, not options:
			 * "--max" matching --max-restarts and --max_restarts is
			 * ambiguous too */
			if (found >= 0)
				ambiguous = true;
			found = id;
		}
	}
	return ambiguous ? -2 : found;
}

static int find_short(char c)
{
	for (int id = 0; id < O_COUNT; id++)
		if (opts[id].names[0] && opts[id].names[0][1] == c && opts[id].names[0][2] == '\0')
			return id;
	return -1;
}

static enum run_opts_result take(struct parse *p, enum opt_id id, const char *explicit_val,
	int *i, int argc, char **argv)
{
	char label[160];
	opt_label(id, label, sizeof(label));
	if (!(opts[id].flags & OPT_VALUE)) {
		if (explicit_val)
			return usage_error(p->errs, "argument %s: ignored explicit argument '%s'", label, explicit_val);
		p->flag[id] = true;
		p->given[id] = true;
		return RUN_OPTS_OK;
	}
	if (!explicit_val) {
		if (*i + 1 >= argc || looks_like_option(argv[*i + 1]))
			return usage_error(p->errs, "argument %s: expected one argument", label);
		explicit_val = argv[++*i];
	}
	if (opts[id].choices) {
		bool ok = false;
		for (const char *const *c = opts[id].choices; *c; c++)
			ok |= !strcmp(*c, explicit_val);
		if (!ok) {
			char list[160];
			size_t off = 0;
			for (const char *const *c = opts[id].choices; *c; c++)
				off += (size_t)snprintf(list + off, sizeof(list) - off, "%s'%s'", off ? ", " : "", *c);
			return usage_error(p->errs, "argument %s: invalid choice: '%s' (choose from %s)", label, explicit_val, list);
		}
	}
	p->val[id] = explicit_val;
	p->given[id] = true;
	return RUN_OPTS_OK;
}

/* Python int(): optional whitespace and sign, digits with single underscores. */
static int py_int(const char *s, long long *out)
{
	char buf[64];
	size_t n = 0;
	const char *e;
	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		e--;
	if (s == e || (size_t)(e - s) >= sizeof(buf))
		return -EINVAL;
	for (const char *c = s; c < e; c++) {
		if (*c == '_') {
			if (c == s || !isdigit((unsigned char)c[-1]) || c + 1 == e || !isdigit((unsigned char)c[1]))
				return -EINVAL;
			continue;
		}
		if (!isdigit((unsigned char)*c) && !(c == s && (*c == '+' || *c == '-')))
			return -EINVAL;
		buf[n++] = *c;
	}
	buf[n] = '\0';
	if (n == 0 || ((buf[0] == '+' || buf[0] == '-') && n == 1))
		return -EINVAL;
	errno = 0;
	*out = strtoll(buf, NULL, 10);
	return errno ? -ERANGE : 0;
}

static enum run_opts_result int_arg(struct parse *p, enum opt_id id, long long min, long long max, unsigned *out)
{
	char label[160];
	long long v;
	opt_label(id, label, sizeof(label));
	if (py_int(p->val[id], &v) < 0)
		return usage_error(p->errs, "argument %s: invalid int value: '%s'", label, p->val[id]);
	if (v < min || v > max)
		return usage_error(p->errs, "argument %s: %lld is out of range [%lld, %lld]", label, v, min, max);
	*out = (unsigned)v;
	return RUN_OPTS_OK;
}

int run_opts_signal_from_name(const char *name)
{
	if (strncmp(name, "SIG", 3))
		return -1;
	for (int s = 1; s < NSIG; s++) {
		const char *abbrev = sigabbrev_np(s);
		if (abbrev && !strcmp(abbrev, name + 3))
			return s;
	}
	return -1;
}

int run_opts_std_parse(const char *v, struct run_opts_std *s, struct dptp_err *err)
{
	memset(s, 0, sizeof(*s));
	for (size_t i = 0; i < RUN_STD_MAP_MAX; i++)
		s->map[i] = -1;
	if (v[0] >= '0' && v[0] <= '3' && v[1] == '\0') {
		s->all = v[0] - '0';
		return 0;
	}
	/* ^(\d:[0123],)*(\d:[0123])$ */
	const char *c = v;
	for (;;) {
		if (!isdigit((unsigned char)c[0]) || c[1] != ':' || c[2] < '0' || c[2] > '3')
			goto bad;
		s->map[c[0] - '0'] = c[2] - '0';
		if (c[3] == '\0')
			break;
		if (c[3] != ',')
			goto bad;
		c += 4;
	}
	s->is_map = true;
	return 0;
bad:
	return dptp_err_set(err, -EINVAL, "%s does not match: <^[0-3]$> or <^(\\d:[0123],)*(\\d:[0123])$>", v);
}

int run_opts_std_for(const struct run_opts_std *s, unsigned local_rank)
{
	if (!s->is_map)
		return s->all;
	if (local_rank >= RUN_STD_MAP_MAX || s->map[local_rank] < 0)
		return 0;
	return s->map[local_rank];
}

int run_opts_parse_endpoint(const char *ep, char *host, size_t hostlen, int *port, struct dptp_err *err)
{
	const char *h = ep, *colon = NULL;
	size_t hl;
	*port = -1;
	if (ep[0] == '[') {
		const char *close = strchr(ep, ']');
		if (!close)
			return dptp_err_set(err, -EINVAL, "the hostname of the rendezvous endpoint '%s' must be a dot-separated list of labels, an IPv4 address, or an IPv6 address", ep);
		h = ep + 1;
		hl = (size_t)(close - h);
		if (close[1] == ':')
			colon = close + 1;
		else if (close[1] != '\0')
			return dptp_err_set(err, -EINVAL, "invalid rendezvous endpoint '%s'", ep);
	} else {
		colon = strrchr(ep, ':');
		hl = colon ? (size_t)(colon - ep) : strlen(ep);
	}
	if (colon) {
		uint64_t p;
		if (dptp_parse_u64(colon + 1, 0, 65535, false, &p) < 0)
			return dptp_err_set(err, -EINVAL, "the port number of the rendezvous endpoint '%s' must be an integer between 0 and 65536", ep);
		*port = (int)p;
	}
	if (hl == 0)
		return dptp_err_set(err, -EINVAL, "the rendezvous endpoint '%s' has no host", ep);
	if (hl >= hostlen)
		return dptp_err_set(err, -ENAMETOOLONG, "the rendezvous endpoint host in '%s' is too long", ep);
	memcpy(host, h, hl);
	host[hl] = '\0';
	return 0;
}

/* GPU count through the CUDA driver API, without linking it. */
static int cuda_device_count(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	int n = 0;
	if (!lib)
		return 0;
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
	int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
	if (!init || !count || init(0) != 0 || count(&n) != 0)
		n = 0;
	dlclose(lib);
	return n;
}

int run_opts_nproc_resolve(const char *v, unsigned *out, struct dptp_err *err)
{
	long long n;
	if (!strcmp(v, "cpu") || !strcmp(v, "auto")) {
		int g = !strcmp(v, "auto") ? cuda_device_count() : 0;
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		*out = g > 0 ? (unsigned)g : (unsigned)(c > 0 ? c : 1);
		return 0;
	}
	if (!strcmp(v, "gpu")) {
		int g = cuda_device_count();
		if (g <= 0)
			return dptp_err_set(err, -ENODEV, "Cuda is not available. (--nproc-per-node=gpu found no GPUs; use a number or cpu)");
		*out = (unsigned)g;
		return 0;
	}
	if (!strcmp(v, "xpu"))
		return dptp_err_set(err, -ENODEV, "Xpu is not available.");
	if (py_int(v, &n) < 0)
		return dptp_err_set(err, -EINVAL, "Unsupported nproc_per_node value: %s", v);
	if (n < 1 || n > 4096)
		return dptp_err_set(err, -ERANGE, "nproc_per_node=%lld must be between 1 and 4096", n);
	*out = (unsigned)n;
	return 0;
}

static enum run_opts_result parse_nnodes(struct parse *p, struct run_opts *o)
{
	const char *v = p->val[O_NNODES];
	const char *colon = strchr(v, ':');
	long long a, b;
	char tmp[64];
	if (strlen(v) >= sizeof(tmp))
		goto bad;
	if (!colon) {
		if (py_int(v, &a) < 0)
			goto bad;
		b = a;
	} else {
		if (strchr(colon + 1, ':'))
			goto bad;
		memcpy(tmp, v, (size_t)(colon - v));
		tmp[colon - v] = '\0';
		if (py_int(tmp, &a) < 0 || py_int(colon + 1, &b) < 0)
			goto bad;
	}
	if (a <= 0 || a > b || b > 65535)
		return usage_error(p->errs, "nnodes=%s: need 0 < MIN <= MAX", v);
	o->min_nodes = (unsigned)a;
	o->max_nodes = (unsigned)b;
	return RUN_OPTS_OK;
bad:
	return usage_error(p->errs, "nnodes=%s is not in \"MIN:MAX\" format", v);
}

/* The c10d keys (dynamic_rendezvous.create_handler, c10d backend), with
 * RendezvousParameters' get_as_int / get_as_bool rules and messages. */
static enum run_opts_result c10d_conf_key(struct parse *p, struct run_opts *o, const char *key, const char *val)
{
	static const struct { const char *key; size_t off; const char *what; } ints[] = {
		{"join_timeout", offsetof(struct run_opts, c10d.join), "join"},
		{"last_call_timeout", offsetof(struct run_opts, c10d.last_call), "last_call"},
		{"close_timeout", offsetof(struct run_opts, c10d.close), "close"},
		{"heartbeat_timeout", offsetof(struct run_opts, c10d.heartbeat), "heartbeat"},
		{"keep_alive_interval", offsetof(struct run_opts, c10d.keep_alive_interval), "keep-alive interval"},
		{"keep_alive_max_attempt", offsetof(struct run_opts, c10d.keep_alive_max_attempt), "keep-alive attempt count"},
		{"read_timeout", offsetof(struct run_opts, c10d.read), "read"},
	};
	long long v;
	if (!strcmp(key, "is_host")) {
		static const char *const yes[] = {"1", "true", "t", "yes", "y"}, *const no[] = {"0", "false", "f", "no", "n"};
		for (size_t i = 0; i < 5; i++) {
			if (!strcasecmp(val, yes[i]))
				o->c10d.is_host = 1;
			if (!strcasecmp(val, no[i]))
				o->c10d.is_host = 0;
		}
		if (o->c10d.is_host < 0)
			return usage_error(p->errs, "The rendezvous configuration option '%s' does not represent a valid boolean value.", key);
		return RUN_OPTS_OK;
	}
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		if (strcmp(key, ints[i].key))
			continue;
		if (py_int(val, &v) < 0)
			return usage_error(p->errs, "The rendezvous configuration option '%s' does not represent a valid integer value.", key);
		if (v <= 0 || v > 86400 * 365)
			return usage_error(p->errs, "The %s timeout (%s s) must be positive.", ints[i].what, val);
		*(unsigned *)((char *)o + ints[i].off) = (unsigned)v;
	}
	return RUN_OPTS_OK;
}

static enum run_opts_result parse_rdzv_conf(struct parse *p, struct run_opts *o)
{
	char *dup = strdup(p->val[O_RDZV_CONF]), *save = NULL;
	enum run_opts_result r = RUN_OPTS_OK;
	o->rdzv_timeout = 900;
	o->c10d.join = 600;
	o->c10d.last_call = 30;
	o->c10d.close = 30;
	o->c10d.heartbeat = 5;
	o->c10d.keep_alive_interval = 5;
	o->c10d.keep_alive_max_attempt = 3;
	o->c10d.read = 60;
	o->c10d.is_host = -1;
	if (!dup)
		return usage_error(p->errs, "out of memory");
	char *s = dup;
	while (isspace((unsigned char)*s))
		s++;
	if (*s == '\0')
		goto out;
	for (char *kv = strtok_r(s, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '='), *key = kv, *val = NULL;
		if (eq) {
			*eq = '\0';
			val = eq + 1;
		}
		while (isspace((unsigned char)*key))
			key++;
		for (char *e = key + strlen(key); e > key && isspace((unsigned char)e[-1]); )
			*--e = '\0';
		if (!*key) {
			r = usage_error(p->errs, "The rendezvous configuration string must be in format <key1>=<value1>,...,<keyN>=<valueN>.");
			goto out;
		}
		if (val)
			while (isspace((unsigned char)*val))
				val++;
		if (!val || !*val) {
			r = usage_error(p->errs, "The rendezvous configuration option '%s' must have a value specified.", key);
			goto out;
		}
		if ((r = c10d_conf_key(p, o, key, val)))
			goto out;
		if (!strcmp(key, "timeout")) {
			long long t;
			if (py_int(val, &t) < 0 || t <= 0 || t > INT_MAX) {
				r = usage_error(p->errs, "invalid rendezvous timeout '%s'", val);
				goto out;
			}
			o->rdzv_timeout = (unsigned)t;
		}
	}
out:
	free(dup);
	return r;
}

static enum run_opts_result parse_filter(struct parse *p, struct run_opts *o)
{
	const char *v = p->val[O_LOCAL_RANKS_FILTER];
	o->local_ranks_filter_raw = v;
	if (!v || !*v)
		return RUN_OPTS_OK;
	size_t n = 1;
	for (const char *c = v; *c; c++)
		n += *c == ',';
	o->local_ranks_filter = calloc(n, sizeof(int));
	if (!o->local_ranks_filter)
		return usage_error(p->errs, "out of memory");
	const char *c = v;
	for (size_t i = 0; i < n; i++) {
		const char *comma = strchr(c, ',');
		size_t len = comma ? (size_t)(comma - c) : strlen(c);
		char tmp[32];
		long long r;
		if (len >= sizeof(tmp))
			goto bad;
		memcpy(tmp, c, len);
		tmp[len] = '\0';
		if (py_int(tmp, &r) < 0 || r < INT_MIN || r > INT_MAX)
			goto bad;
		o->local_ranks_filter[i] = (int)r;
		c = comma ? comma + 1 : c + len;
	}
	o->nlocal_ranks_filter = n;
	return RUN_OPTS_OK;
bad:
	return usage_error(p->errs, "--local_ranks_filter must be a comma-separated list of integers e.g. --local_ranks_filter=1,2");
}

static enum run_opts_result parse_signals(struct parse *p, struct run_opts *o)
{
	const char *v = p->val[O_SIGNALS];
	const char *c = v;
	o->signals_to_handle = v;
	o->nsignals = 0;
	while (*c) {
		const char *comma = strchr(c, ',');
		size_t len = comma ? (size_t)(comma - c) : strlen(c);
		char name[32];
		const char *s = c, *e = c + len;
		while (s < e && isspace((unsigned char)*s))
			s++;
		while (e > s && isspace((unsigned char)e[-1]))
			e--;
		if (e > s) {
			int sig;
			if ((size_t)(e - s) >= sizeof(name))
				return usage_error(p->errs, "unknown signal in --signals-to-handle: '%.*s'", (int)(e - s), s);
			memcpy(name, s, (size_t)(e - s));
			name[e - s] = '\0';
			sig = run_opts_signal_from_name(name);
			if (sig < 0 || sig == SIGKILL || sig == SIGSTOP)
				return usage_error(p->errs, "unknown or unhandleable signal in --signals-to-handle: '%s'", name);
			if (o->nsignals == RUN_MAX_SIGNALS)
				return usage_error(p->errs, "too many signals in --signals-to-handle: '%s'", v);
			o->signals[o->nsignals++] = sig;
		}
		c = comma ? comma + 1 : e;
		if (!comma)
			break;
	}
	return RUN_OPTS_OK;
}

static enum run_opts_result convert(struct parse *p, struct run_opts *o)
{
	struct dptp_err err = {0};
	enum run_opts_result r;

	if ((r = parse_nnodes(p, o)))
		return r;
	o->nproc_raw = p->val[O_NPROC];
	if (run_opts_nproc_resolve(o->nproc_raw, &o->nproc, &err) < 0)
		return usage_error(p->errs, "%s", err.msg);
	o->rdzv_backend = p->val[O_RDZV_BACKEND];
	o->rdzv_endpoint = p->val[O_RDZV_ENDPOINT];
	o->rdzv_id = p->val[O_RDZV_ID];
	o->rdzv_conf = p->val[O_RDZV_CONF];
	if ((r = parse_rdzv_conf(p, o)))
		return r;
	if (strcmp(o->rdzv_backend, "static") && strcmp(o->rdzv_backend, "c10d") &&
	    strcmp(o->rdzv_backend, "etcd") && strcmp(o->rdzv_backend, "etcd-v2"))
		return usage_error(p->errs, "The rendezvous backend '%s' is not registered; use static, c10d, etcd or etcd-v2", o->rdzv_backend);
	if ((r = int_arg(p, O_MAX_RESTARTS, 0, INT_MAX, &o->max_restarts)))
		return r;
	{
		char *end;
		const char *s = p->val[O_MONITOR_INTERVAL];
		errno = 0;
		o->monitor_interval = strtod(s, &end);
		while (isspace((unsigned char)*end))
			end++;
		/* Python's float() reads no hex: strtod's "0x1p3" is refused */
		if (end == s || *end || errno || !isfinite(o->monitor_interval) || strpbrk(s, "xX"))
			return usage_error(p->errs, "argument --monitor-interval/--monitor_interval: invalid float value: '%s'", s);
		if (o->monitor_interval <= 0 || o->monitor_interval > 3600)
			return usage_error(p->errs, "monitor_interval=%s must be in (0, 3600] seconds", s);
	}
	o->start_method = p->val[O_START_METHOD];
	o->event_log_handler = p->val[O_EVENT_LOG_HANDLER];
	o->role = p->val[O_ROLE];
	o->standalone = p->flag[O_STANDALONE];
	o->module = p->flag[O_MODULE];
	o->no_python = p->flag[O_NO_PYTHON];
	o->run_path = p->flag[O_RUN_PATH];
	o->virtual_local_rank = p->flag[O_VIRTUAL_LOCAL_RANK];
	/* as torch's config_from_args: --run-path goes first, the others are not looked at */
	if (o->no_python && o->module && !o->run_path)
		return usage_error(p->errs, "Don't use both the '--no-python' flag and the '--module' flag at the same time.");
	o->log_dir = p->val[O_LOG_DIR] && *p->val[O_LOG_DIR] ? p->val[O_LOG_DIR] : NULL;
	if (run_opts_std_parse(p->val[O_REDIRECTS], &o->redirects, &err) < 0 ||
	    run_opts_std_parse(p->val[O_TEE], &o->tee, &err) < 0)
		return usage_error(p->errs, "%s", err.msg);
	if ((r = parse_filter(p, o)))
		return r;
	o->dup_stdout_filters = p->val[O_DUP_STDOUT];
	o->dup_stderr_filters = p->val[O_DUP_STDERR];
	if ((r = int_arg(p, O_NODE_RANK, 0, 65535, &o->node_rank)))
		return r;
	/* as torchrun's parse_rendezvous_endpoint: "[::1]" is host ::1 */
	o->master_addr = dptp_host_unbracket(p->val[O_MASTER_ADDR], o->master_addr_buf, sizeof(o->master_addr_buf));
	if ((r = int_arg(p, O_MASTER_PORT, 0, 65535, &o->master_port)))
		return r;
	o->local_addr = p->val[O_LOCAL_ADDR];
	o->logs_specs = p->val[O_LOGS_SPECS];
	o->numa_binding = p->val[O_NUMA_BINDING];
	o->audit_opts = (struct audit_opts){.on = p->flag[O_AUDIT], .keep = p->flag[O_AUDIT_KEEP],
		.layout = p->val[O_AUDIT_LAYOUT], .output = p->val[O_AUDIT_OUTPUT], .format = p->val[O_AUDIT_FORMAT],
		.hang = p->val[O_AUDIT_HANG], .log_dir = o->log_dir};
	/* the world is known at start when the node count is fixed; one worker
	 * alone may start its own ranks (mp.spawn): its world is not known */
	if (o->min_nodes == o->max_nodes && (uint64_t)o->max_nodes * o->nproc > 1 &&
	    (uint64_t)o->max_nodes * o->nproc <= UINT_MAX)
		o->audit_opts.world = o->max_nodes * o->nproc;
	if ((r = parse_signals(p, o)))
		return r;
	if (o->node_rank >= o->max_nodes)
		return usage_error(p->errs, "node_rank=%u must be smaller than nnodes=%u", o->node_rank, o->max_nodes);
	if (o->max_nodes > 1 || o->min_nodes != o->max_nodes) {
		if (o->standalone)
			return usage_error(p->errs, "--standalone is one node; --nnodes=%s asks for more", p->val[O_NNODES]);
		if (!strncmp(o->rdzv_backend, "etcd", 4))
			return usage_error(p->errs, "--rdzv-backend=%s with --nnodes=%s is not supported; use --rdzv-backend=c10d (the same --rdzv-endpoint syntax, a TCPStore instead of etcd)",
				o->rdzv_backend, p->val[O_NNODES]);
		if (!strcmp(o->rdzv_backend, "static") && o->min_nodes != o->max_nodes)
			return usage_error(p->errs, "elastic --nnodes=%s needs --rdzv-backend=c10d; the static rendezvous has a fixed node count",
				p->val[O_NNODES]);
	}
	warn_unsupported(p->errs, o);
	return RUN_OPTS_OK;
}

enum run_opts_result run_opts_parse(struct run_opts *o, int argc, char **argv, FILE *out, FILE *errs)
{
	struct parse p = {.errs = errs};
	enum run_opts_result r;
	bool dashdash = false;
	int i;

	memset(o, 0, sizeof(*o));
	for (int id = 0; id < O_COUNT; id++) {
		p.val[id] = opts[id].dflt;
		if (!(opts[id].flags & OPT_PET))
			continue;
		char name[64] = "PET_";
		for (size_t k = 0; opts[id].dest[k] && k + 5 < sizeof(name); k++)
			name[4 + k] = (char)toupper((unsigned char)opts[id].dest[k]);
		const char *env = getenv(name);
		if (!env)
			continue;
		if (opts[id].flags & OPT_VALUE) {
			p.val[id] = env;
		} else {
			long long v;
			if (py_int(env, &v) < 0)
				return usage_error(errs, "invalid %s value '%s': must be an integer", name, env);
			p.flag[id] = v != 0;
		}
	}

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--")) {
			dashdash = true;
			i++;
			break;
		}
		if (!looks_like_option(a))
			break;
		if (a[1] == '-') {
			const char *eq = strchr(a, '=');
			size_t len = eq ? (size_t)(eq - a) : strlen(a);
			char amb[1024];
			int id = find_long(a, len, amb, sizeof(amb));
			if (id == -2)
				return usage_error(errs, "ambiguous option: %.*s could match %s", (int)len, a, amb);
			if (id < 0) {
				if (p.nunknown < DPTP_ARRAY_LEN(p.unknown))
					p.unknown[p.nunknown++] = a;
				continue;
			}
			if (id == O_HELP) {
				if (eq)
					return usage_error(errs, "argument -h/--help: ignored explicit argument '%s'", eq + 1);
				run_opts_print_help(out);
				return RUN_OPTS_HELP;
			}
			if ((r = take(&p, (enum opt_id)id, eq ? eq + 1 : NULL, &i, argc, argv)))
				return r;
			continue;
		}
		/* single dash: -r3, -r=3, -r 3, -m, combined flags -mt3 */
		for (const char *c = a + 1; *c; ) {
			int id = find_short(*c);
			if (id < 0) {
				if (p.nunknown < DPTP_ARRAY_LEN(p.unknown))
					p.unknown[p.nunknown++] = a;
				break;
			}
			if (id == O_HELP) {
				if (c[1])
					return usage_error(errs, "argument -h/--help: ignored explicit argument '%s'",
							   c[1] == '=' ? c + 2 : c + 1);
				run_opts_print_help(out);
				return RUN_OPTS_HELP;
			}
			if (opts[id].flags & OPT_VALUE) {
				const char *v = c[1] ? (c[1] == '=' ? c + 2 : c + 1) : NULL;
				if ((r = take(&p, (enum opt_id)id, v, &i, argc, argv)))
					return r;
				break;
			}
			if ((r = take(&p, (enum opt_id)id, NULL, &i, argc, argv)))
				return r;
			c++;
		}
	}
	if (i >= argc)
		return usage_error(errs, "the following arguments are required: training_script, training_script_args");
	if (p.nunknown) {
		char list[1024];
		size_t off = 0;
		list[0] = '\0';
		for (size_t k = 0; k < p.nunknown && off < sizeof(list); k++)
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", k ? " " : "", p.unknown[k]);
		return usage_error(errs, "unrecognized arguments: %s", list);
	}
	o->script = argv[i];
	o->script_args = argv + i + 1;
	o->nscript_args = argc - i - 1;
	/* argparse (Python 3.11 to 3.13 alike) removes one "--" from a command
	 * line: one before the script, else one right after it ("-m mod --
	 * --depth=20" hands the module "--depth=20"); any other stays ("echo a
	 * -- b" prints "a -- b"). */
	if (!dashdash && o->nscript_args && !strcmp(o->script_args[0], "--")) {
		o->script_args++;
		o->nscript_args--;
	}
	r = convert(&p, o);
	if (r)
		run_opts_release(o);
	return r;
}

int run_opts_env_read(struct run_opts_env *e, const char **bad)
{
	static const char *const stop_vars[] = {"DPTP_RUN_STOP_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"};
	const char *env;

	*e = (struct run_opts_env){.stop_timeout = 30.0, .barrier_timeout = 300.0};
	for (size_t i = 0; i < DPTP_ARRAY_LEN(stop_vars); i++) {
		if (!(env = getenv(stop_vars[i])) || !*env)
			continue;
		uint64_t secs;
		if (i == 0 ? dptp_parse_double(env, 0, 86400, &e->stop_timeout) < 0
			   : dptp_parse_u64(env, 0, 86400, false, &secs) < 0) {
			*bad = stop_vars[i];
			return -EINVAL;
		}
		if (i == 1)
			e->stop_timeout = (double)secs;
		break;
	}
	if ((env = getenv("DPTP_RUN_EXIT_BARRIER_TIMEOUT")) && *env &&
	    dptp_parse_double(env, 0, 86400, &e->barrier_timeout) < 0) {
		*bad = "DPTP_RUN_EXIT_BARRIER_TIMEOUT";
		return -EINVAL;
	}
	env = getenv("LOGLEVEL");
	e->info_log = env && (!strcasecmp(env, "INFO") || !strcasecmp(env, "DEBUG"));
	return 0;
}

void run_opts_release(struct run_opts *o)
{
	if (!o)
		return;
	free(o->local_ranks_filter);
	o->local_ranks_filter = NULL;
	o->nlocal_ranks_filter = 0;
}
