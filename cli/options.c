/* dptp-check's command line. One table below is the only list of options:
 * it generates getopt_long's struct option[], the optstring and --help. */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/layout.h"
#include "checks/check.h"

enum opt_kind {
	KIND_INT,      /* int field, [min,max], optional multiple-of */
	KIND_U64,      /* uint64_t field, [min,max] */
	KIND_DOUBLE,   /* double field, (0,max] */
	KIND_CHOICE,   /* enum field, index into choices[] */
	KIND_CHECKS,   /* dptp_check_set: LIST|all */
	KIND_FAULTS,   /* dptp_fault_set: LIST|all|none */
	KIND_STRING,   /* const char * field, borrowed from argv */
	KIND_FLAG,     /* bool field set to true */
	KIND_COUNT,    /* int field incremented */
};

struct opt_row {
	const char *name;       /* long name */
	int short_name;         /* 0: none */
	const char *arg;        /* argument name for --help; NULL: takes none */
	const char *help;
	enum opt_kind kind;
	size_t offset;          /* into struct dptp_options */
	uint64_t min, max;      /* KIND_INT, KIND_U64; max also for KIND_DOUBLE */
	int multiple;           /* KIND_INT: value must be a multiple of this */
	bool suffix;            /* KIND_INT: K/M/G allowed */
	const char *const *choices; /* KIND_CHOICE, NULL-terminated */
};

#define OFF(field) offsetof(struct dptp_options, field)

static const char *const backend_choices[] = { "auto", "host", "cuda", NULL };
static const char *const dtype_choices[] = { "bf16", "fp16", "fp32", NULL };
static const char *const format_choices[] = { "text", "json", "junit", NULL };

static const struct opt_row table[] = {
	{ .name = "dp", .arg = "N",
	  .help = "data-parallel size (default: world / (tp*pp))",
	  .kind = KIND_INT, .offset = OFF(dp), .min = 1, .max = 4096, .multiple = 1 },
	{ .name = "tp", .arg = "N",
	  .help = "tensor-parallel size (default 1)",
	  .kind = KIND_INT, .offset = OFF(tp), .min = 1, .max = 4096, .multiple = 1 },
	{ .name = "pp", .arg = "N",
	  .help = "pipeline-parallel size (default 1)",
	  .kind = KIND_INT, .offset = OFF(pp), .min = 1, .max = 4096, .multiple = 1 },
	{ .name = "checks", .arg = "LIST",
	  .help = "checks to run, comma-separated, or 'all' (default all)",
	  .kind = KIND_CHECKS, .offset = OFF(checks) },
	{ .name = "inject", .arg = "LIST",
	  .help = "faults to inject, comma-separated, 'all' or 'none' (default none)",
	  .kind = KIND_FAULTS, .offset = OFF(inject) },
	{ .name = "backend", .arg = "auto|host|cuda",
	  .help = "data-plane backend (default auto: cuda when usable)",
	  .kind = KIND_CHOICE, .offset = OFF(backend), .choices = backend_choices },
	{ .name = "dtype", .arg = "bf16|fp16|fp32",
	  .help = "element type of the data-plane checks (default bf16)",
	  .kind = KIND_CHOICE, .offset = OFF(dtype), .choices = dtype_choices },
	{ .name = "tokens", .arg = "N",
	  .help = "tokens per rank, 1..65536 (default 128)",
	  .kind = KIND_INT, .offset = OFF(tokens), .min = 1, .max = 65536, .multiple = 1, .suffix = true },
	{ .name = "hidden", .arg = "N",
	  .help = "hidden size, 8..65536, a multiple of 8 (default 4096)",
	  .kind = KIND_INT, .offset = OFF(hidden), .min = 8, .max = 65536, .multiple = 8, .suffix = true },
	{ .name = "seed", .arg = "N",
	  .help = "seed of every input (default 1)",
	  .kind = KIND_U64, .offset = OFF(seed), .max = UINT64_MAX },
	{ .name = "timeout", .arg = "SEC",
	  .help = "watchdog per check in seconds, up to 86400 (default 60)",
	  .kind = KIND_DOUBLE, .offset = OFF(timeout), .max = 86400 },
	{ .name = "eps", .arg = "X",
	  .help = "RMSNorm epsilon, in (0, 1] (default 1e-6)",
	  .kind = KIND_DOUBLE, .offset = OFF(eps), .max = 1 },
	{ .name = "format", .arg = "text|json|junit",
	  .help = "report format (default text)",
	  .kind = KIND_CHOICE, .offset = OFF(format), .choices = format_choices },
	{ .name = "output", .arg = "FILE",
	  .help = "write the report to FILE, atomically (- or default: stdout)",
	  .kind = KIND_STRING, .offset = OFF(output) },
	{ .name = "layouts", .arg = "all|DPxPPxTP,...",
	  .help = "run the checks over every (dp, pp, tp) factorisation of the world, "
		"or over the listed ones, regrouping without a relaunch, and print a layout x replica matrix; "
		"not with --dp, --tp, --pp or --bench",
	  .kind = KIND_STRING, .offset = OFF(layouts) },
	{ .name = "bench",
	  .help = "also time fused vs unfused allreduce over a token sweep",
	  .kind = KIND_FLAG, .offset = OFF(bench) },
	{ .name = "list",
	  .help = "list the checks and faults, then exit",
	  .kind = KIND_FLAG, .offset = OFF(list) },
	{ .name = "verbose", .short_name = 'v',
	  .help = "more detail in the report and on stderr (repeatable)",
	  .kind = KIND_COUNT, .offset = OFF(verbose) },
	{ .name = "version",
	  .help = "print the version and exit",
	  .kind = KIND_FLAG, .offset = OFF(version) },
	{ .name = "help", .short_name = 'h',
	  .help = "print this help and exit",
	  .kind = KIND_FLAG, .offset = OFF(help) },
};

#define NOPTS DPTP_ARRAY_LEN(table)

/* KIND_CHOICE stores an index through an int pointer. */
_Static_assert(sizeof(enum dptp_backend_choice) == sizeof(int), "enum size");
_Static_assert(sizeof(enum dptp_dtype) == sizeof(int), "enum size");
_Static_assert(sizeof(enum dptp_format) == sizeof(int), "enum size");

/* getopt_long's value of row i: its short letter, or 256 + i. */
static int opt_val(size_t i)
{
	return table[i].short_name ? table[i].short_name : 256 + (int)i;
}

static int row_of_val(int val)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (opt_val(i) == val)
			return (int)i;
	return -1;
}

/* Every check of the registry. */
static dptp_check_set all_checks(void)
{
	return dptp_nchecks >= DPTP_MAX_CHECKS ? ~(dptp_check_set)0 : ((dptp_check_set)1 << dptp_nchecks) - 1;
}

void dptp_options_init(struct dptp_options *o)
{
	memset(o, 0, sizeof(*o));
	o->checks = all_checks();
	o->inject = 0;
	o->backend = DPTP_BACKEND_AUTO;
	o->dtype = DPTP_DTYPE_BF16;
	o->tokens = 128;
	o->hidden = 4096;
	o->seed = 1;
	o->timeout = 60;
	o->eps = 1e-6;
	o->format = DPTP_FORMAT_TEXT;
}

static int bad_value(struct dptp_err *err, const struct opt_row *row, const char *v,
		     const char *why)
{
	return dptp_err_set(err, -EINVAL, "invalid value '%s' for --%s: %s", v, row->name, why);
}

static int parse_checks(const struct opt_row *row, const char *v, dptp_check_set *out,
			struct dptp_err *err)
{
	if (strcmp(v, "all") == 0) {
		*out = all_checks();
		return 0;
	}
	dptp_check_set set = 0;
	const char *p = v;
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char name[64];
		if (n == 0)
			return bad_value(err, row, v, "empty check name");
		if (n >= sizeof(name))
			return bad_value(err, row, v, "check name too long");
		memcpy(name, p, n);
		name[n] = 0;
		int id = dptp_check_lookup(name);
		if (id < 0)
			return dptp_err_set(err, -EINVAL,
					    "invalid value '%s' for --%s: unknown check '%s' (see --list)",
					    v, row->name, name);
		if (set & (1u << id))
			return dptp_err_set(err, -EINVAL,
					    "invalid value '%s' for --%s: check '%s' given twice",
					    v, row->name, name);
		set |= 1u << id;
		if (!comma)
			break;
		p = comma + 1;
	}
	*out = set;
	return 0;
}

static const char *choice_list(const char *const *choices, char *buf, size_t len)
{
	size_t n = 0, k = 0;
	while (choices[n])
		n++;
	buf[0] = 0;
	for (size_t i = 0; i < n; i++) {
		const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
		k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s%s", sep, choices[i]);
		if (k >= len)
			break;
	}
	return buf;
}

static int apply(struct dptp_options *o, const struct opt_row *row, const char *v,
		 struct dptp_err *err)
{
	char *field = (char *)o + row->offset;
	switch (row->kind) {
	case KIND_INT:
	case KIND_U64: {
		uint64_t x; /* decimal: "010" is 10, as torch reads it */
		int rc = dptp_parse_u64(v, row->min, row->max, row->suffix, &x);
		if (rc == -ERANGE) {
			char why[64];
			snprintf(why, sizeof(why), "out of range %" PRIu64 "..%" PRIu64,
				 row->min, row->max);
			return bad_value(err, row, v, why);
		}
		if (rc < 0)
			return bad_value(err, row, v, "not a number");
		if (row->kind == KIND_U64) {
			*(uint64_t *)(void *)field = x;
			return 0;
		}
		if (row->multiple > 1 && x % (uint64_t)row->multiple) {
			char why[64];
			snprintf(why, sizeof(why), "not a multiple of %d", row->multiple);
			return bad_value(err, row, v, why);
		}
		*(int *)(void *)field = (int)x;
		return 0;
	}
	case KIND_DOUBLE: {
		double x;
		int rc = dptp_parse_double(v, 0, (double)row->max, &x);
		if (rc == -EINVAL)
			return bad_value(err, row, v, "not a number");
		if (rc < 0 || !(x > 0)) {
			char why[64];
			snprintf(why, sizeof(why), "must be > 0 and <= %" PRIu64, row->max);
			return bad_value(err, row, v, why);
		}
		*(double *)(void *)field = x;
		return 0;
	}
	case KIND_CHOICE:
		for (int i = 0; row->choices[i]; i++) {
			if (strcmp(row->choices[i], v) == 0) {
				/* enum fields: int-sized */
				*(int *)(void *)field = i;
				return 0;
			}
		}
		{
			char list[128], why[160];
			snprintf(why, sizeof(why), "expected %s",
				 choice_list(row->choices, list, sizeof(list)));
			return bad_value(err, row, v, why);
		}
	case KIND_CHECKS:
		return parse_checks(row, v, (dptp_check_set *)(void *)field, err);
	case KIND_FAULTS: {
		struct dptp_err ferr = {0};
		dptp_fault_set set;
		if (dptp_fault_parse(v, &set, &ferr) < 0)
			return bad_value(err, row, v, ferr.msg);
		*(dptp_fault_set *)(void *)field = set;
		return 0;
	}
	case KIND_STRING:
		if (!*v)
			return bad_value(err, row, v, "empty file name");
		*(const char **)(void *)field = v;
		return 0;
	case KIND_FLAG:
		*(bool *)(void *)field = true;
		return 0;
	case KIND_COUNT:
		(*(int *)(void *)field)++;
		return 0;
	}
	return -EINVAL;
}

/* An unknown or ambiguous long option, named without any "=value". */
static int unrecognized(struct dptp_err *err, const char *arg)
{
	size_t n = strcspn(arg, "=");
	char cands[256] = "";
	size_t k = 0;
	int nmatch = 0;
	if (n > 2 && strncmp(arg, "--", 2) == 0) {
		for (size_t i = 0; i < NOPTS; i++) {
			if (strncmp(table[i].name, arg + 2, n - 2) != 0)
				continue;
			k += (size_t)snprintf(cands + k, k < sizeof(cands) ? sizeof(cands) - k : 0,
					      "%s--%s", nmatch ? ", " : "", table[i].name);
			nmatch++;
		}
	}
	if (nmatch > 1)
		return dptp_err_set(err, -EINVAL, "ambiguous option '%.*s' (could be %s)",
				    (int)n, arg, cands);
	return dptp_err_set(err, -EINVAL, "unrecognized option '%.*s'", (int)n, arg);
}

int dptp_options_parse(struct dptp_options *o, int argc, char **argv, struct dptp_err *err)
{
	struct option longopts[NOPTS + 1];
	/* '+': stop at the first operand (refused below); ':': report a
	 * missing argument as ':' rather than '?'. */
	char optstring[2 + 2 * NOPTS + 1];
	size_t k = 0;
	optstring[k++] = '+';
	optstring[k++] = ':';
	for (size_t i = 0; i < NOPTS; i++) {
		longopts[i] = (struct option){
			.name = table[i].name,
			.has_arg = table[i].arg ? required_argument : no_argument,
			.flag = NULL,
			.val = opt_val(i),
		};
		if (table[i].short_name) {
			optstring[k++] = (char)table[i].short_name;
			if (table[i].arg)
				optstring[k++] = ':';
		}
	}
	longopts[NOPTS] = (struct option){0};
	optstring[k] = 0;

	opterr = 0;
	optind = 0; /* full re-initialisation of getopt's state */
	for (;;) {
		int c = getopt_long(argc, argv, optstring, longopts, NULL);
		if (c == -1)
			break;
		if (c == ':') {
			int r = row_of_val(optopt);
			if (r >= 0)
				return dptp_err_set(err, -EINVAL, "missing argument for --%s", table[r].name);
			return dptp_err_set(err, -EINVAL, "missing argument for '-%c'", optopt);
		}
		if (c == '?') {
			/* glibc: optopt 0 for an unknown or ambiguous long
			 * option (already stepped over), the option's value
			 * for "--flag=value", the letter for an unknown -x. */
			if (optopt == 0)
				return unrecognized(err, argv[optind - 1]);
			int r = row_of_val(optopt);
			if (r >= 0)
				return dptp_err_set(err, -EINVAL, "option '--%s' takes no argument",
						    table[r].name);
			return dptp_err_set(err, -EINVAL, "unrecognized option '-%c'", optopt);
		}
		int r = row_of_val(c);
		if (r < 0)
			return dptp_err_set(err, -EINVAL, "unrecognized option '-%c'", c);
		DPTP_TRY(apply(o, &table[r], optarg, err));
	}
	if (optind < argc)
		return dptp_err_set(err, -EINVAL, "unexpected argument '%s'", argv[optind]);
	if (o->layouts) {
		int lay[DPTP_MAX_LAYOUTS][3], n = 0;
		DPTP_TRY(dptp_layouts_parse(o->layouts, 0, lay, DPTP_MAX_LAYOUTS, &n, err));
		if (o->dp || o->tp || o->pp)
			return dptp_err_set(err, -EINVAL, "--layouts cannot be combined with --dp, --tp or --pp "
					    "(it chooses the layouts itself)");
		if (o->bench)
			return dptp_err_set(err, -EINVAL, "--layouts cannot be combined with --bench");
	}
	if (o->output && strcmp(o->output, "-") == 0)
		o->output = NULL; /* "-": standard output, as with no --output */
	return 0;
}

int dptp_layouts_parse(const char *s, int world, int (*out)[3], int max, int *n, struct dptp_err *err)
{
	*n = 0;
	if (strcmp(s, "all") == 0) {
		for (int dp = world; world > 0 && dp >= 1; dp--)
			for (int pp = world / dp; world % dp == 0 && pp >= 1; pp--)
				if ((world / dp) % pp == 0 && *n < max) {
					out[*n][0] = dp;
					out[*n][1] = pp;
					out[*n][2] = world / dp / pp;
					(*n)++;
				}
		return 0;
	}
	const char *p = s;
	for (;;) {
		size_t len = strcspn(p, ",");
		char part[64];
		int v[3];
		char tail;
		if (len == 0 || len >= sizeof(part))
			return dptp_err_set(err, -EINVAL, "invalid value '%s' for --layouts: empty or over-long layout", s);
		memcpy(part, p, len);
		part[len] = 0;
		bool ok = strspn(part, "0123456789x") == len && part[0] != '0' && !strstr(part, "x0") &&
			  sscanf(part, "%dx%dx%d%c", &v[0], &v[1], &v[2], &tail) == 3;
		for (int k = 0; ok && k < 3; k++)
			ok = v[k] >= 1 && v[k] <= 4096;
		if (!ok)
			return dptp_err_set(err, -EINVAL, "invalid value '%s' for --layouts: '%s' is not DPxPPxTP "
					    "(three sizes 1..4096, e.g. 2x1x2)", s, part);
		/* up to 4096^3: in 64 bits (in int, 2642x2501x650 wraps to 4) */
		long long prod = (long long)v[0] * v[1] * v[2];
		if (prod > DPTP_MAX_WORLD)
			return dptp_err_set(err, -EINVAL, "invalid value '%s' for --layouts: '%s' has %lld ranks, "
					    "more than a job can hold (%d)", s, part, prod, DPTP_MAX_WORLD);
		if (world > 0 && prod != world)
			return dptp_err_set(err, -EINVAL, "--layouts %s: dp %d x pp %d x tp %d = %lld, but the world size is %d",
					    part, v[0], v[1], v[2], prod, world);
		for (int i = 0; i < *n; i++)
			if (out[i][0] == v[0] && out[i][1] == v[1] && out[i][2] == v[2])
				return dptp_err_set(err, -EINVAL, "invalid value '%s' for --layouts: '%s' given twice", s, part);
		if (*n >= max)
			return dptp_err_set(err, -EINVAL, "invalid value '%s' for --layouts: more than %d layouts", s, max);
		memcpy(out[(*n)++], v, sizeof(v));
		if (!p[len])
			break;
		p += len + 1;
	}
	return 0;
}

/* Writes a two-space gap and text, the cursor being at column col - 2;
 * wraps at words before column max, continuation lines indented to col. */
static void wrap(FILE *f, const char *text, int col, int max)
{
	int at = col;
	bool line_start = true;
	fputs("  ", f);
	for (const char *p = text; *p;) {
		int n = (int)strcspn(p, " ");
		if (!line_start && at + 1 + n > max) {
			fprintf(f, "\n%*s", col, "");
			at = col;
			line_start = true;
		}
		if (!line_start) {
			fputc(' ', f);
			at++;
		}
		fprintf(f, "%.*s", n, p);
		at += n;
		line_start = false;
		p += n;
		while (*p == ' ')
			p++;
	}
	fputc('\n', f);
}

/* "label name name ...", wrapped before column 80. */
static void name_list(FILE *f, const char *label, const char *const *names, int n)
{
	int at = fprintf(f, "%s", label);
	for (int i = 0; i < n; i++) {
		int len = (int)strlen(names[i]);
		if (at + 1 + len > 79)
			at = fprintf(f, "\n %*s", (int)strlen(label), "") - 1;
		at += fprintf(f, " %s", names[i]);
	}
	fputc('\n', f);
}

void dptp_options_usage(FILE *f)
{
	char lhs[NOPTS][64];
	int width = 0;
	for (size_t i = 0; i < NOPTS; i++) {
		const struct opt_row *row = &table[i];
		char s[8] = "    ";
		if (row->short_name)
			snprintf(s, sizeof(s), "-%c, ", row->short_name);
		int n = snprintf(lhs[i], sizeof(lhs[i]), "%s--%s%s%s", s, row->name,
				 row->arg ? " " : "", row->arg ? row->arg : "");
		if (n > width)
			width = n;
	}
	fputs("usage: dptp-check [OPTION]...\n"
	      "Checks the DP x PP x TP process groups of a job and reports pass/fail\n"
	      "per DP replica. Run one copy per rank under dptp-run, mpirun or srun.\n"
	      "\noptions:\n", f);
	for (size_t i = 0; i < NOPTS; i++) {
		fprintf(f, "  %-*s", width, lhs[i]);
		wrap(f, table[i].help, width + 4, 79);
	}
	const char *checks[DPTP_MAX_CHECKS], *faults[DPTP_NFAULTS];
	for (int i = 0; i < dptp_nchecks; i++)
		checks[i] = dptp_check_name(i);
	for (int i = 0; i < DPTP_NFAULTS; i++)
		faults[i] = dptp_faults[i].name;
	fputc('\n', f);
	name_list(f, "checks:", checks, dptp_nchecks);
	name_list(f, "faults:", faults, DPTP_NFAULTS);
	fputs("\nexit status: 0 pass, 1 a check failed, 2 usage error,\n"
	      "3 environment or bootstrap error (a SIGTERM, SIGINT or SIGHUP too),\n"
	      "4 a check timed out. With --output the report is written on every\n"
	      "exit but an unreadable command line. See dptp-check(1).\n", f);
}

bool dptp_use_colour(int fd)
{
	return isatty(fd) && !getenv("NO_COLOR") && !getenv("OMPI_COMM_WORLD_SIZE");
}
