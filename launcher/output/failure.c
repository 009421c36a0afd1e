/* Failure report (see failure.h). */
#include "output/failure.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "report/report.h"

/* ---- a minimal JSON reader: enough for error.json ---- */

struct jv {
	enum { J_NONE, J_STR, J_NUM, J_OBJ, J_OTHER } t;
	char *s;          /* J_STR (malloc'd) */
	double num;       /* J_NUM */
	const char *at;   /* J_OBJ: start ('{') */
};

static const char *ws(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	return p;
}

/* The string at p as json.loads reads it (base/json.h; a lone surrogate
 * as its own bytes), malloc'd into *out; the byte after it, or NULL. */
static const char *parse_str(const char *p, char **out)
{
	const char *e = p + 1;
	while (*e && *e != '"')
		e += *e == '\\' && e[1] ? 2 : 1;
	struct dptp_buf b = {0};
	const char *q = dptp_json_read_str(p, e + (*e == '"'), &b, DPTP_JSON_SURROGATEPASS);
	*out = q ? dptp_buf_detach(&b, NULL) : NULL;
	dptp_buf_release(&b);
	return *out ? q : NULL;
}

static const char *skip_value(const char *p);

static const char *parse_value(const char *p, struct jv *v)
{
	p = ws(p);
	memset(v, 0, sizeof(*v));
	if (*p == '"') {
		v->t = J_STR;
		return parse_str(p, &v->s);
	}
	if (*p == '{') {
		v->t = J_OBJ;
		v->at = p;
		return skip_value(p);
	}
	if (*p == '-' || isdigit((unsigned char)*p)) {
		char *end;
		v->t = J_NUM;
		v->num = strtod(p, &end);
		return end;
	}
	v->t = J_OTHER;
	return skip_value(p);
}

static const char *skip_value(const char *p)
{
	p = ws(p);
	if (*p == '"') {
		char *s;
		p = parse_str(p, &s);
		if (p)
			free(s);
		return p;
	}
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		p = ws(p + 1);
		if (*p == close)
			return p + 1;
		for (;;) {
			p = skip_value(p);
			if (!p)
				return NULL;
			p = ws(p);
			if (close == '}' && *p == ':') {
				p = skip_value(p + 1);
				if (!p)
					return NULL;
				p = ws(p);
			}
			if (*p == ',') {
				p++;
				continue;
			}
			return *p == close ? p + 1 : NULL;
		}
	}
	if (!*p)
		return NULL;
	while (*p && !strchr(",}] \t\r\n", *p))
		p++;
	return p;
}

/* Looks key up in the object starting at obj; fills v, cleared on a miss
 * (caller frees v->s either way). */
static int obj_get(const char *obj, const char *key, struct jv *v)
{
	const char *p = ws(obj);
	memset(v, 0, sizeof(*v)); /* callers free v->s on a miss too */
	if (*p != '{')
		return -1;
	p = ws(p + 1);
	if (*p == '}')
		return -1;
	for (;;) {
		char *k;
		p = ws(p);
		if (*p != '"' || !(p = parse_str(p, &k)))
			return -1;
		p = ws(p);
		if (*p != ':') {
			free(k);
			return -1;
		}
		bool hit = !strcmp(k, key);
		free(k);
		if (hit)
			return parse_value(p + 1, v) ? 0 : -1;
		if (!(p = skip_value(p + 1)))
			return -1;
		p = ws(p);
		if (*p != ',')
			return -1;
		p++;
	}
}

static char *indent(const char *s)
{
	size_t n = 1;
	for (const char *c = s; *c; c++)
		n += *c == '\n' ? 3 : 1;
	char *o = malloc(n), *q = o;
	if (!o)
		return NULL;
	for (const char *c = s; *c; c++) {
		*q++ = *c;
		if (*c == '\n') {
			*q++ = ' ';
			*q++ = ' ';
		}
	}
	*q = '\0';
	return o;
}

int failure_parse_error_json(const char *text, char **message, long long *timestamp)
{
	struct jv msg = {0}, tmp = {0};
	*message = NULL;
	*timestamp = 0;
	if (obj_get(text, "message", &msg) < 0)
		return -1;
	if (msg.t == J_STR) {
		/* plain form: {"message": "<text>", "timestamp": <int>}; an
		 * empty text is no message (torch then makes one up) */
		*message = msg.s && *msg.s ? msg.s : NULL;
		if (!*message)
			free(msg.s);
		if (obj_get(text, "timestamp", &tmp) == 0) {
			if (tmp.t == J_NUM)
				*timestamp = (long long)tmp.num;
			else if (tmp.t == J_STR)
				*timestamp = strtoll(tmp.s, NULL, 10);
			free(tmp.s);
		}
		return 0;
	}
	if (msg.t != J_OBJ)
		return -1;
	/* {"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}} */
	struct jv extra = {0}, cs = {0};
	char *shown = NULL;
	if (obj_get(msg.at, "extraInfo", &extra) == 0 && extra.t == J_OBJ) {
		if (obj_get(extra.at, "py_callstack", &cs) == 0 && cs.t == J_STR)
			shown = cs.s;
		else
			free(cs.s);
		if (obj_get(extra.at, "timestamp", &tmp) == 0) {
			if (tmp.t == J_NUM)
				*timestamp = (long long)tmp.num;
			else if (tmp.t == J_STR)
				*timestamp = strtoll(tmp.s, NULL, 10);
			free(tmp.s);
			tmp = (struct jv){0};
		}
	} else {
		free(extra.s);
	}
	if (!shown) {
		if (obj_get(msg.at, "message", &tmp) == 0 && tmp.t == J_STR)
			shown = tmp.s;
		else {
			free(tmp.s);
			shown = strdup("<N/A>");
		}
	}
	*message = shown ? indent(shown) : NULL;
	free(shown);
	return *message ? 0 : -1;
}

/* ---- failures ---- */

char *failure_read_text(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t len = 0, cap = 0;
	if (!f)
		return NULL;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *g;
			cap = (len + 4096 + 1) * 2;
			if (cap > (16u << 20) || !(g = realloc(buf, cap)))
				break;
			buf = g;
		}
		size_t n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
		if (n == 0)
			break;
	}
	fclose(f);
	if (buf)
		buf[len] = '\0';
	return buf;
}

void failure_init(struct failure *f, unsigned local_rank, unsigned global_rank, pid_t pid,
	int exitcode, const char *error_file, const char *abort_msg)
{
	char *text = NULL;
	memset(f, 0, sizeof(*f));
	f->local_rank = local_rank;
	f->global_rank = global_rank;
	f->pid = pid;
	f->exitcode = exitcode;
	f->timestamp = (long long)time(NULL);
	if (error_file && *error_file && (text = failure_read_text(error_file))) {
		long long ts;
		char *msg;
		if (failure_parse_error_json(text, &msg, &ts) == 0) {
			f->error_file = strdup(error_file);
			f->message = msg;
			f->timestamp = ts;
		}
		free(text);
	}
	if (!f->message) { /* an empty py_callstack is shown as it is, as torch */
		if (abort_msg)
			f->message = strdup(abort_msg);
		else if (exitcode < 0) {
			const char *ab = sigabbrev_np(-exitcode);
			if (asprintf(&f->message, "Signal %d (SIG%s) received by PID %d", -exitcode, ab ? ab : "UNKNOWN", (int)pid) < 0)
				f->message = NULL;
		} else {
			f->message = strdup("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html");
		}
	}
}

void failure_release(struct failure *f)
{
	if (!f)
		return;
	free(f->error_file);
	free(f->message);
	memset(f, 0, sizeof(*f));
}

static char *format_failure(size_t idx, const struct failure *f, const char *host, size_t *width)
{
	char when[64];
	time_t t = (time_t)f->timestamp;
	struct tm tm;
	char *out = NULL;
	localtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d_%H:%M:%S", &tm);
	if (asprintf(&out,
		"[%zu]:\n"
		"  time      : %s\n"
		"  host      : %s\n"
		"  rank      : %u (local_rank: %u)\n"
		"  exitcode  : %d (pid: %d)\n"
		"  error_file: %s\n"
		"  traceback : %s",
		idx, when, host, f->global_rank, f->local_rank, f->exitcode, (int)f->pid,
		f->error_file ? f->error_file : "<N/A>", f->message ? f->message : "") < 0)
		return NULL;
	for (const char *line = out; *line; ) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		if (len > *width)
			*width = len;
		line += len + (nl ? 1 : 0);
	}
	return out;
}

size_t failure_root(const struct failure *f, size_t n)
{
	size_t root = 0;
	for (size_t i = 1; i < n; i++)
		if (f[i].timestamp < f[root].timestamp)
			root = i;
	return root;
}

char *failure_error_json_with_code(const char *text, int code)
{
	struct jv msg;
	char *out = NULL;
	if (obj_get(text, "message", &msg) < 0)
		return NULL;
	if (msg.t != J_OBJ || !code) {
		/* torchrun copies a plain message as it is */
		free(msg.s);
		return strdup(text);
	}
	/* json.load keeps the last of two equal keys, so an errorCode the
	 * child wrote itself is overridden as torchrun's dict assignment does */
	const char *end = skip_value(msg.at), *close = end - 1;
	const char *p = ws(msg.at + 1);
	if (asprintf(&out, "%.*s%s\"errorCode\": %d%s", (int)(close - text), text, *p == '}' ? "" : ", ", code,
		     close) < 0)
		return NULL;
	return out;
}

int failure_record_launcher(const char *parent_file, const char *what)
{
	FILE *f;
	if (!parent_file || !*parent_file)
		return -1;
	unlink(parent_file);
	if (!(f = fopen(parent_file, "we")))
		return -1;
	fputs("{\"message\": {\"message\": \"", f);
	dptp_json_escape(f, what, strlen(what));
	fputs("\", \"extraInfo\": {\"py_callstack\": \"", f);
	dptp_json_escape(f, what, strlen(what));
	fprintf(f, "\\n\", \"timestamp\": \"%lld\"}}}", (long long)time(NULL));
	return fclose(f) == 0 ? 0 : -1;
}

int failure_dump_root_cause(const struct failure *root, const char *parent_file)
{
	char *text, *out;
	int rc = -1;
	if (!root->error_file || !parent_file || !*parent_file || !(text = failure_read_text(root->error_file)))
		return -1;
	if ((out = failure_error_json_with_code(text, root->exitcode))) {
		int fd;
		unlink(parent_file);
		if ((fd = open(parent_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) >= 0) {
			size_t len = strlen(out), off = 0;
			ssize_t w = 0;
			while (off < len && ((w = write(fd, out + off, len - off)) > 0 || errno == EINTR))
				off += w > 0 ? (size_t)w : 0;
			rc = close(fd) == 0 && off == len ? 0 : -1;
		}
		free(out);
	}
	free(text);
	return rc;
}

void failure_report_write(FILE *out, const char *name, const struct failure *f, size_t n, const char *host)
{
	size_t root = failure_root(f, n), width;
	char **fmt = calloc(n ? n : 1, sizeof(char *));
	char title[4200];
	if (!fmt)
		return;
	snprintf(title, sizeof(title), "%s FAILED", name);
	width = strlen(title);
	for (size_t i = 0; i < n; i++)
		fmt[i] = format_failure(i, &f[i], host, &width);
	if (width > 60)
		width = 60;
	char border[61], section[61];
	memset(border, '=', width);
	border[width] = '\0';
	memset(section, '-', width);
	section[width] = '\0';
	fprintf(out, "%s\n%s\n%s\nFailures:\n", border, title, section);
	bool others = false;
	for (size_t i = 0; i < n; i++) {
		if (i == root || !fmt[i])
			continue;
		fprintf(out, "%s%s", others ? "\n" : "", fmt[i]);
		others = true;
	}
	if (!others)
		fputs("  <NO_OTHER_FAILURES>", out);
	fprintf(out, "\n%s\nRoot Cause (first observed failure):\n%s\n%s\n", section, n ? fmt[root] : "", border);
	for (size_t i = 0; i < n; i++)
		free(fmt[i]);
	free(fmt);
	fflush(out);
}
