/* torchrun's agent events (see events.h). */
#include "output/events.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/utf8.h"
#include "base/util.h"
#include "output/failure.h"
#include "base/host.h"

/* ---- Python's json.dumps pieces ---- */

/* A string as json.dumps writes it (base/json.h). */
static void put_str(FILE *o, const char *s)
{
	struct dptp_buf b = {0};
	dptp_json_str(&b, s, strlen(s), 0);
	if (!b.oom)
		fwrite(b.buf, 1, b.len, o);
	dptp_buf_release(&b);
}

void events_float_repr(double v, char *buf, size_t len)
{
	char digits[40];
	int exp10 = 0;
	if (isnan(v)) {
		snprintf(buf, len, "NaN");
		return;
	}
	if (isinf(v)) {
		snprintf(buf, len, v < 0 ? "-Infinity" : "Infinity");
		return;
	}
	if (v == 0) {
		snprintf(buf, len, signbit(v) ? "-0.0" : "0.0");
		return;
	}
	/* the shortest digits that read back as v */
	for (int prec = 1; prec <= 17; prec++) {
		char sci[48];
		snprintf(sci, sizeof(sci), "%.*e", prec - 1, v);
		if (strtod(sci, NULL) != v && prec < 17)
			continue;
		char *e = strchr(sci, 'e');
		exp10 = atoi(e + 1);
		size_t n = 0;
		for (char *c = sci; c < e; c++)
			if (*c >= '0' && *c <= '9')
				digits[n++] = *c;
		while (n > 1 && digits[n - 1] == '0')
			n--;
		digits[n] = '\0';
		break;
	}
	/* repr's layout: exponent form below 1e-4 and from 1e16 on */
	char out[64];
	size_t nd = strlen(digits), k = 0;
	if (v < 0)
		out[k++] = '-';
	if (exp10 < -4 || exp10 >= 16) {
		out[k++] = digits[0];
		if (nd > 1) {
			out[k++] = '.';
			for (size_t i = 1; i < nd; i++)
				out[k++] = digits[i];
		}
		snprintf(out + k, sizeof(out) - k, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
	} else if (exp10 < 0) {
		out[k++] = '0';
		out[k++] = '.';
		for (int i = 0; i < -exp10 - 1; i++)
			out[k++] = '0';
		for (size_t i = 0; i < nd; i++)
			out[k++] = digits[i];
		out[k] = '\0';
	} else {
		for (int i = 0; i <= exp10; i++)
			out[k++] = (size_t)i < nd ? digits[i] : '0';
		out[k++] = '.';
		if ((size_t)exp10 + 1 >= nd)
			out[k++] = '0';
		for (size_t i = (size_t)exp10 + 1; i < nd; i++)
			out[k++] = digits[i];
		out[k] = '\0';
	}
	snprintf(buf, len, "%s", out);
}

/* ---- re-dumping a JSON text as json.dumps(json.loads(text)) ---- */

struct redump {
	const char *p;
	FILE *o;
	int depth;
	bool message_falsy; /* the top-level "message" is "", {}, [], 0, false or null */
};

static void skip_ws(struct redump *r)
{
	while (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')
		r->p++;
}

static int hex4(const char *p, unsigned *u)
{
	*u = 0;
	for (int i = 0; i < 4; i++) {
		char c = p[i];
		unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
			: c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16;
		if (d == 16)
			return -1;
		*u = *u << 4 | d;
	}
	return 0;
}

/* A string: decoded and written again; *empty tells whether it was "".
 * Raw bytes are read as errors="replace" reads them (base/utf8.h). */
static int rd_string(struct redump *r, bool *empty)
{
	const unsigned char *p = (const unsigned char *)r->p + 1;
	struct dptp_buf out = {0};
	int rc = -1;
	*empty = *p == '"';
	dptp_buf_addc(&out, '"');
	while (*p != '"') {
		if (!*p || *p < 0x20)
			goto fail;
		if (*p != '\\') {
			size_t n = strnlen((const char *)p, 4), k;
			uint32_t cp = 0xfffd;
			if (!(k = dptp_utf8_next(p, n, 0, &cp)))
				k = dptp_utf8_invalid_len(p, n);
			dptp_json_cp(&out, cp);
			p += k;
			continue;
		}
		unsigned u;
		switch (p[1]) {
		case '"': dptp_json_cp(&out, '"'); break;
		case '\\': dptp_json_cp(&out, '\\'); break;
		case '/': dptp_json_cp(&out, '/'); break;
		case 'b': dptp_json_cp(&out, '\b'); break;
		case 'f': dptp_json_cp(&out, '\f'); break;
		case 'n': dptp_json_cp(&out, '\n'); break;
		case 'r': dptp_json_cp(&out, '\r'); break;
		case 't': dptp_json_cp(&out, '\t'); break;
		case 'u':
			if (hex4((const char *)p + 2, &u) < 0)
				goto fail;
			/* UTF-16 units pass through as Python keeps them */
			dptp_json_cp(&out, u);
			p += 4;
			break;
		default:
			goto fail;
		}
		p += 2;
	}
	dptp_buf_addc(&out, '"');
	if (!out.oom) {
		fwrite(out.buf, 1, out.len, r->o);
		r->p = (const char *)p + 1;
		rc = 0;
	}
fail:
	dptp_buf_release(&out);
	return rc;
}

static int rd_number(struct redump *r, bool *zero)
{
	const char *s = r->p, *c = s;
	bool frac = false;
	if (*c == '-')
		c++;
	if (*c == '0')
		c++;
	else if (*c >= '1' && *c <= '9')
		while (*c >= '0' && *c <= '9')
			c++;
	else
		return -1;
	if (*c == '.') {
		frac = true;
		if (c[1] < '0' || c[1] > '9')
			return -1;
		for (c++; *c >= '0' && *c <= '9'; c++)
			;
	}
	if (*c == 'e' || *c == 'E') {
		frac = true;
		c++;
		if (*c == '+' || *c == '-')
			c++;
		if (*c < '0' || *c > '9')
			return -1;
		while (*c >= '0' && *c <= '9')
			c++;
	}
	if (frac) {
		char buf[64];
		double v = strtod(s, NULL);
		events_float_repr(v, buf, sizeof(buf));
		fputs(buf, r->o);
		*zero = v == 0;
	} else {
		/* a Python int: the digits, without the sign of -0 */
		const char *d = s + (*s == '-');
		*zero = d[0] == '0';
		if (*zero)
			fputc('0', r->o);
		else
			fwrite(s, 1, (size_t)(c - s), r->o);
	}
	r->p = c;
	return 0;
}

static int rd_value(struct redump *r, bool *falsy);
static int rd_string(struct redump *r, bool *empty);

/* One re-dumped piece into a string of its own. */
static char *rd_piece(struct redump *r, bool key, bool *falsy)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *saved = r->o;
	r->o = open_memstream(&buf, &len);
	if (!r->o) {
		r->o = saved;
		return NULL;
	}
	int rc = key ? (*r->p == '"' ? rd_string(r, falsy) : -1) : rd_value(r, falsy);
	fclose(r->o);
	r->o = saved;
	if (rc < 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* An object as a Python dict: a repeated key keeps its first place and
 * takes the last value. */
static int rd_object(struct redump *r, bool *empty)
{
	char **kv = NULL; /* key, value, key, value... */
	size_t n = 0;
	int rc = -1;
	r->p++;
	r->depth++;
	skip_ws(r);
	*empty = *r->p == '}';
	for (bool first = true; *r->p != '}'; first = false) {
		bool f;
		if (!first) {
			if (*r->p != ',')
				goto out;
			r->p++;
			skip_ws(r);
		}
		char *k = rd_piece(r, true, &f), *v = NULL;
		skip_ws(r);
		if (k && *r->p == ':') {
			r->p++;
			skip_ws(r);
			v = rd_piece(r, false, &f);
		}
		char **more = k && v ? realloc(kv, (n + 2) * sizeof(*kv)) : NULL;
		if (!more) {
			free(k);
			free(v);
			goto out;
		}
		kv = more;
		if (r->depth == 1 && !strcmp(k, "\"message\""))
			r->message_falsy = f;
		size_t i = 0;
		while (i < n && strcmp(kv[i], k))
			i += 2;
		if (i < n) {
			free(k);
			free(kv[i + 1]);
			kv[i + 1] = v;
		} else {
			kv[n++] = k;
			kv[n++] = v;
		}
		skip_ws(r);
	}
	r->p++;
	r->depth--;
	fputc('{', r->o);
	for (size_t i = 0; i < n; i += 2)
		fprintf(r->o, "%s%s: %s", i ? ", " : "", kv[i], kv[i + 1]);
	fputc('}', r->o);
	rc = 0;
out:
	for (size_t i = 0; i < n; i++)
		free(kv[i]);
	free(kv);
	return rc;
}

static int rd_array(struct redump *r, bool *empty)
{
	r->p++;
	r->depth++;
	fputc('[', r->o);
	skip_ws(r);
	*empty = *r->p == ']';
	for (bool first = true; *r->p != ']'; first = false) {
		bool f;
		if (!first) {
			if (*r->p != ',')
				return -1;
			r->p++;
			skip_ws(r);
			fputs(", ", r->o);
		}
		if (rd_value(r, &f) < 0)
			return -1;
		skip_ws(r);
	}
	r->p++;
	r->depth--;
	fputc(']', r->o);
	return 0;
}

static int rd_value(struct redump *r, bool *falsy)
{
	static const struct {
		const char *in, *out;
		bool falsy;
	} words[] = {
		{"true", "true", false}, {"false", "false", true}, {"null", "null", true},
		{"NaN", "NaN", false}, {"Infinity", "Infinity", false}, {"-Infinity", "-Infinity", false},
	};
	skip_ws(r);
	if (r->depth > 64)
		return -1;
	switch (*r->p) {
	case '"':
		return rd_string(r, falsy);
	case '{':
		return rd_object(r, falsy);
	case '[':
		return rd_array(r, falsy);
	}
	for (size_t i = 0; i < DPTP_ARRAY_LEN(words); i++) {
		size_t n = strlen(words[i].in);
		if (!strncmp(r->p, words[i].in, n)) {
			fputs(words[i].out, r->o);
			*falsy = words[i].falsy;
			r->p += n;
			return 0;
		}
	}
	return rd_number(r, falsy);
}

/* text re-dumped; *falsy_message: torch's "if not self.message". */
static char *redump(const char *text, bool *falsy_message)
{
	char *buf = NULL;
	size_t len = 0;
	bool f;
	struct redump r = {.p = text};
	r.o = open_memstream(&buf, &len);
	if (!r.o)
		return NULL;
	int rc = rd_value(&r, &f);
	skip_ws(&r);
	fclose(r.o);
	if (rc < 0 || *r.p) {
		free(buf);
		return NULL;
	}
	if (falsy_message)
		*falsy_message = r.message_falsy;
	return buf;
}

char *events_json_redump(const char *text)
{
	return redump(text, NULL);
}

/* ---- events ---- */

int events_init(struct agent_events *e, const char *handler, int fd)
{
	memset(e, 0, sizeof(*e));
	e->fd = -1;
	e->start = dptp_now();
	if (!handler || !strcmp(handler, "null") || !strcmp(handler, "dynamic_rendezvous"))
		return 0;
	if (strcmp(handler, "console"))
		return -1;
	/* torch's events logger: level LOGLEVEL (default INFO), events at INFO */
	static const char *const above_info[] = {"WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"};
	const char *lv = getenv("LOGLEVEL");
	for (size_t i = 0; lv && i < DPTP_ARRAY_LEN(above_info); i++)
		if (!strcmp(lv, above_info[i]))
			return 0;
	e->fd = fd;
	dptp_getfqdn(e->hostname, sizeof(e->hostname));
	return 0;
}

void events_release(struct agent_events *e)
{
	free(e->entry_point);
	e->entry_point = NULL;
}

static void put_opt_uint(FILE *o, bool have, unsigned v)
{
	if (have)
		fprintf(o, "%u", v);
	else
		fputs("null", o);
}

/* torch's ProcessFailure.error_file_data, dumped. */
static char *raw_error_of(const struct agent_events *e, const struct failure *f)
{
	static const char traits[] = "\"errorTraits\": {\"category\": \"system_terminated_error\", \"retryability\": \"False\"}";
	char *text, *out = NULL;
	if (f->error_file && (text = failure_read_text(f->error_file))) {
		bool falsy = false;
		char *data = redump(text, &falsy);
		free(text);
		if (data && falsy && f->exitcode >= 0 && data[0] == '{') {
			/* error_file_data["errorTraits"] = ...: appended, and the
			 * re-dump puts it where a key of that name already is */
			size_t n = strlen(data);
			char *tmp = NULL;
			if (asprintf(&tmp, "%.*s%s%s}", (int)(n - 1), data, n > 2 ? ", " : "", traits) < 0)
				tmp = NULL;
			free(data);
			out = tmp ? redump(tmp, NULL) : NULL;
			free(tmp);
			return out;
		}
		if (data)
			return data;
	}
	bool traits_on = e->none_has_traits || f->exitcode >= 0;
	if (asprintf(&out, "{\"message\": \"<NONE>\"%s%s}", traits_on ? ", " : "", traits_on ? traits : "") < 0)
		out = NULL;
	return out;
}

static void emit(struct agent_events *e, const char *state, bool agent, unsigned restarts, double duration_ms,
	const char *raw_error, const struct event_worker *w)
{
	char *md = NULL, *line = NULL, *raw = NULL;
	size_t mdlen = 0, len = 0;
	FILE *o = open_memstream(&md, &mdlen);
	if (!o)
		return;
	fputs("{\"group_world_size\": ", o);
	put_opt_uint(o, e->have_group, e->group_world_size);
	fputs(", \"entry_point\": ", o);
	put_str(o, e->entry_point ? e->entry_point : "");
	if (w) {
		bool end = strcmp(state, "START") != 0;
		fprintf(o, ", \"local_rank\": [%u], \"role_rank\": [%u], \"role_world_size\": [%u]", w->local_rank,
			w->role_rank, w->role_world_size);
		if (end && w->fail)
			fprintf(o, ", \"exit_code\": [%d], \"worker_pid\": [%d]", w->fail->exitcode, (int)w->fail->pid);
		else
			fputs(", \"exit_code\": [null], \"worker_pid\": [null]", o);
		if (end && w->fail)
			raw = raw_error_of(e, w->fail);
	}
	fputc('}', o);
	fclose(o);
	o = open_memstream(&line, &len);
	if (!o || !md) {
		free(md);
		free(raw);
		return;
	}
	fprintf(o, "{\"name\": \"torchelastic.worker.status.%s\", \"source\": \"%s\", \"timestamp\": 0, \"metadata\": {\"run_id\": ",
		state, agent ? "AGENT" : "WORKER");
	put_str(o, e->run_id ? e->run_id : "");
	fputs(", \"global_rank\": ", o);
	put_opt_uint(o, w != NULL, w ? w->global_rank : 0);
	fputs(", \"group_rank\": ", o);
	put_opt_uint(o, e->have_group, e->group_rank);
	fputs(", \"worker_id\": ", o);
	if (w)
		fprintf(o, "\"%d\"", (int)w->pid);
	else
		fputs("null", o);
	fputs(", \"role\": ", o);
	put_str(o, e->role ? e->role : "");
	fputs(", \"hostname\": ", o);
	put_str(o, e->hostname);
	fprintf(o, ", \"state\": \"%s\", \"total_run_time\": %ld, \"rdzv_backend\": ", state, e->total_run_time);
	put_str(o, e->backend ? e->backend : "");
	fputs(", \"raw_error\": ", o);
	if (raw || raw_error)
		put_str(o, raw ? raw : raw_error);
	else
		fputs("null", o);
	fputs(", \"metadata\": ", o);
	put_str(o, md);
	fprintf(o, ", \"agent_restarts\": %u, \"duration_ms\": ", restarts);
	if (duration_ms >= 0) {
		char f[48];
		events_float_repr(duration_ms, f, sizeof(f));
		fputs(f, o);
	} else {
		fputs("null", o);
	}
	fputs("}}\n", o);
	fclose(o);
	/* one write: the line never mixes with the workers' tee'd lines */
	for (size_t off = 0; line && off < len;) {
		ssize_t n = write(e->fd, line + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	free(line);
	free(md);
	free(raw);
}

void events_agent(struct agent_events *e, const char *state, unsigned restarts, double duration_ms,
	const char *raw_error)
{
	if (e->fd >= 0)
		emit(e, state, true, restarts, duration_ms, raw_error, NULL);
}

void events_worker(struct agent_events *e, const char *state, unsigned restarts, const struct event_worker *w)
{
	if (e->fd >= 0)
		emit(e, state, false, restarts, -1, NULL, w);
}

void events_note_failure(struct agent_events *e, const struct failure *f)
{
	if (!f->error_file && f->exitcode >= 0)
		e->none_has_traits = true;
}
