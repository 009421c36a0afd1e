/* libFuzzer: the JSON, JUnit and text writers (lib/report/report_*.c) and their
 * escapers, fed hostile strings (control bytes, quotes, invalid UTF-8,
 * "]]>", "</testcase>") in every string field of a report. The JSON output
 * must parse (a strict RFC 8259 checker below) and be valid UTF-8; the XML
 * output must hold only characters XML 1.0 allows; an escaped field must
 * never contain its quote or markup characters raw. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- checks on the output ------------------------------------------------ */

/* Length of the UTF-8 sequence at p (strict: no overlongs, no surrogates,
 * <= U+10FFFF), 0 if invalid; *cp gets the code point. */
static size_t utf8_seq(const uint8_t *p, size_t n, uint32_t *cp)
{
	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	size_t len;
	uint32_t c, min;
	if ((p[0] & 0xE0) == 0xC0) { len = 2; c = p[0] & 0x1F; min = 0x80; }
	else if ((p[0] & 0xF0) == 0xE0) { len = 3; c = p[0] & 0x0F; min = 0x800; }
	else if ((p[0] & 0xF8) == 0xF0) { len = 4; c = p[0] & 0x07; min = 0x10000; }
	else return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3F);
	}
	if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return 0;
	*cp = c;
	return len;
}

static bool valid_utf8(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k = utf8_seq(p + i, n - i, &cp);
		if (!k)
			return false;
		i += k;
	}
	return true;
}

static bool xml_chars_ok(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k = utf8_seq(p + i, n - i, &cp);
		if (!k)
			return false;
		if (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r')
			return false;
		if (cp == 0xFFFE || cp == 0xFFFF)
			return false;
		i += k;
	}
	return true;
}

/* Minimal strict JSON checker. */
struct js {
	const char *p, *end;
	int depth;
};

static void ws(struct js *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static bool value(struct js *j);

static bool string(struct js *j)
{
	if (j->p >= j->end || *j->p != '"')
		return false;
	j->p++;
	while (j->p < j->end) {
		unsigned char c = (unsigned char)*j->p++;
		if (c == '"')
			return true;
		if (c < 0x20)
			return false;
		if (c == '\\') {
			if (j->p >= j->end)
				return false;
			char e = *j->p++;
			if (e == 'u') {
				for (int i = 0; i < 4; i++, j->p++)
					if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p) || !*j->p)
						return false;
			} else if (!strchr("\"\\/bfnrt", e) || !e) {
				return false;
			}
		}
	}
	return false;
}

static bool number(struct js *j)
{
	const char *s = j->p;
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p >= j->end)
		return false;
	if (*j->p == '0')
		j->p++;
	else if (*j->p >= '1' && *j->p <= '9')
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	else
		return false;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return false;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return false;
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	return j->p > s;
}

static bool lit(struct js *j, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n))
		return false;
	j->p += n;
	return true;
}

static bool value(struct js *j)
{
	if (++j->depth > 64)
		return false;
	ws(j);
	if (j->p >= j->end)
		return false;
	bool ok;
	char c = *j->p;
	if (c == '{' || c == '[') {
		char close = c == '{' ? '}' : ']';
		j->p++;
		ws(j);
		if (j->p < j->end && *j->p == close) {
			j->p++;
			ok = true;
		} else {
			for (;;) {
				ws(j);
				if (c == '{') {
					if (!string(j))
						return false;
					ws(j);
					if (j->p >= j->end || *j->p++ != ':')
						return false;
				}
				if (!value(j))
					return false;
				ws(j);
				if (j->p >= j->end)
					return false;
				if (*j->p == ',') {
					j->p++;
					continue;
				}
				if (*j->p++ != close)
					return false;
				break;
			}
			ok = true;
		}
	} else if (c == '"') {
		ok = string(j);
	} else if (c == 't') {
		ok = lit(j, "true");
	} else if (c == 'f') {
		ok = lit(j, "false");
	} else if (c == 'n') {
		ok = lit(j, "null");
	} else {
		ok = number(j);
	}
	j->depth--;
	return ok;
}

static bool json_ok(const char *p, size_t n)
{
	struct js j = {.p = p, .end = p + n};
	if (!value(&j))
		return false;
	ws(&j);
	return j.p == j.end;
}

/* ---- the harness ---------------------------------------------------------- */

struct input {
	const uint8_t *p;
	size_t n, off;
};

/* Next NUL-separated field (may be empty); "" once the input is used up. */
static char *field(struct input *in, size_t *len)
{
	size_t s = in->off;
	while (in->off < in->n && in->p[in->off])
		in->off++;
	size_t n = in->off - s;
	if (in->off < in->n)
		in->off++;
	char *f = malloc(n + 1);
	memcpy(f, in->p + s, n);
	f[n] = 0;
	*len = n;
	return f;
}

static uint8_t byte(struct input *in)
{
	return in->off < in->n ? in->p[in->off++] : 0;
}

#define MAXSTR 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = {.p = data, .n = size};
	char *strs[MAXSTR];
	size_t nstr = 0, len;

	/* escapers alone, on the whole input (embedded NULs included) */
	char *buf = NULL;
	size_t blen = 0;
	FILE *f = open_memstream(&buf, &blen);
	dptp_json_escape(f, (const char *)data, size);
	fclose(f);
	if (!valid_utf8((const uint8_t *)buf, blen))
		__builtin_trap();
	for (size_t i = 0; i < blen; i++) {
		if ((unsigned char)buf[i] < 0x20)
			__builtin_trap();
		if (buf[i] == '"' && (i == 0 || buf[i - 1] != '\\'))
			__builtin_trap();
	}
	{
		/* as a JSON string it must parse */
		char *q = malloc(blen + 2);
		q[0] = '"';
		memcpy(q + 1, buf, blen);
		q[blen + 1] = '"';
		if (!json_ok(q, blen + 2))
			__builtin_trap();
		free(q);
	}
	free(buf);
	buf = NULL;
	f = open_memstream(&buf, &blen);
	dptp_xml_escape(f, (const char *)data, size);
	fclose(f);
	if (!xml_chars_ok((const uint8_t *)buf, blen))
		__builtin_trap();
	for (size_t i = 0; i < blen; i++)
		if (buf[i] == '<' || buf[i] == '>' || buf[i] == '"' || buf[i] == '\'')
			__builtin_trap();
	free(buf);

	/* a whole report whose every string comes from the input */
	uint8_t shape = byte(&in);
	size_t nrep = 1 + (shape & 3), nchk = 1 + ((shape >> 2) & 3), ninj = (shape >> 4) & 3;
	struct dptp_report r = {0};
#define STR() (nstr < MAXSTR ? (strs[nstr] = field(&in, &len), strs[nstr++]) : "")
	r.tool = STR();
	r.version = STR();
	r.backend = STR();
	r.bootstrap = STR();
	r.engine = (shape & 0x40) ? STR() : NULL;
	r.world = 4, r.dp = (int)nrep, r.pp = 1, r.tp = 2;
	r.seed = (uint64_t)byte(&in) << 56 | byte(&in);
	const char *inject[3];
	for (size_t i = 0; i < ninj; i++)
		inject[i] = STR();
	r.ninject = ninj;
	r.inject = inject;
	struct dptp_replica_result reps[4];
	struct dptp_check_result chks[4][4];
	int ranks[4][2];
	for (size_t d = 0; d < nrep; d++) {
		reps[d] = (struct dptp_replica_result){.dp = (int)d, .nranks = 2, .ranks = ranks[d],
						      .nchecks = nchk, .checks = chks[d]};
		ranks[d][0] = (int)(2 * d), ranks[d][1] = (int)(2 * d + 1);
		enum dptp_status worst = DPTP_SKIP;
		for (size_t c = 0; c < nchk; c++) {
			struct dptp_check_result *cr = &chks[d][c];
			memset(cr, 0, sizeof(*cr));
			const char *name = STR();
			snprintf(cr->name, sizeof(cr->name), "%s", name);
			uint8_t b = byte(&in);
			cr->status = (enum dptp_status)(b % 5);
			/* odd timings: negative, huge, NaN and infinity */
			static const double secs[] = {0.0012, -1, 1e300, NAN, INFINITY, 5e-324};
			cr->seconds = secs[(b >> 3) % 6];
			cr->detail = STR();
			worst = dptp_status_worst(worst, cr->status);
		}
		reps[d].status = worst;
	}
	r.nreplicas = nrep;
	r.replicas = reps;
	struct dptp_bench_row bench;
	if (shape & 0x80) {
		memset(&bench, 0, sizeof(bench));
		bench.tp = 2, bench.tokens = byte(&in), bench.hidden = 64;
		snprintf(bench.dtype, sizeof(bench.dtype), "%s", STR());
		bench.fused_us = NAN;
		bench.speedup = INFINITY;
		r.nbench = 1;
		r.bench = &bench;
	}

	buf = NULL;
	f = open_memstream(&buf, &blen);
	if (dptp_report_write_json(&r, f) < 0)
		__builtin_trap();
	fclose(f);
	if (!valid_utf8((const uint8_t *)buf, blen) || !json_ok(buf, blen))
		__builtin_trap();
	free(buf);

	buf = NULL;
	f = open_memstream(&buf, &blen);
	if (dptp_report_write_junit(&r, f) < 0)
		__builtin_trap();
	fclose(f);
	if (!xml_chars_ok((const uint8_t *)buf, blen))
		__builtin_trap();
	free(buf);

	buf = NULL;
	f = open_memstream(&buf, &blen);
	dptp_report_write_text(&r, f, shape & 1, shape & 2);
	fclose(f);
	free(buf);

	(void)dptp_report_summary(&r);
	(void)dptp_report_exit_code(&r);
	for (size_t i = 0; i < nstr; i++)
		free(strs[i]);
	return 0;
}
