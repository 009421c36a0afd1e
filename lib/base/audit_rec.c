/* The audit's record format: the parser (see audit_rec.h). */
#include "base/audit_rec.h"

#include "base/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct cursor {
	const char *p, *end;
	char *out;       /* next free byte of r->buf */
	int64_t *aout;   /* next free element of r->arr */
	struct dptp_buf tmp; /* a string being read */
};

static void skip_ws(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
		c->p++;
}

/* A JSON string at c->p (after its opening quote was checked), read as
 * json.loads reads it (base/json.h; a lone surrogate as U+FFFD) and copied
 * into c->out. */
static int parse_string(struct cursor *c, const char **s, size_t *n)
{
	c->tmp.len = 0;
	const char *q = dptp_json_read_str(c->p, c->end, &c->tmp, 0);
	if (!q)
		return -EINVAL;
	c->p = q;
	*s = c->out;
	*n = c->tmp.len;
	if (*n)
		memcpy(c->out, c->tmp.buf, *n);
	c->out[*n] = '\0';
	c->out += *n + 1;
	return 0;
}

/* An integer or a number; *is_int tells which. */
static int parse_number(struct cursor *c, int64_t *i, double *d, bool *is_int)
{
	char tmp[64];
	size_t k = 0;
	while (c->p < c->end && k + 1 < sizeof(tmp) && strchr("+-0123456789.eE", *c->p))
		tmp[k++] = *c->p++;
	tmp[k] = '\0';
	if (!k)
		return -EINVAL;
	char *end;
	*is_int = !strpbrk(tmp, ".eE");
	if (*is_int) {
		errno = 0;
		long long v = strtoll(tmp, &end, 10);
		if (*end || errno)
			return -EINVAL;
		*i = v;
		*d = (double)v;
	} else {
		*d = strtod(tmp, &end);
		if (*end)
			return -EINVAL;
		*i = (int64_t)*d;
	}
	return 0;
}

static bool literal(struct cursor *c, const char *word)
{
	size_t n = strlen(word);
	if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n))
		return false;
	c->p += n;
	return true;
}

static int parse_value(struct cursor *c, struct dptp_audit_field *f)
{
	bool is_int;
	skip_ws(c);
	if (c->p >= c->end)
		return -EINVAL;
	switch (*c->p) {
	case '"':
		f->type = DPTP_AV_STR;
		return parse_string(c, &f->s, &f->n);
	case '[':
		f->type = DPTP_AV_ARR;
		f->a = c->aout;
		f->n = 0;
		c->p++;
		skip_ws(c);
		if (c->p < c->end && *c->p == ']') {
			c->p++;
			return 0;
		}
		for (;;) {
			double d;
			skip_ws(c);
			if (parse_number(c, &c->aout[0], &d, &is_int) < 0 || !is_int)
				return -EINVAL;
			c->aout++;
			f->n++;
			skip_ws(c);
			if (c->p < c->end && *c->p == ',') {
				c->p++;
				continue;
			}
			if (c->p < c->end && *c->p == ']') {
				c->p++;
				return 0;
			}
			return -EINVAL;
		}
	case 'n':
		f->type = DPTP_AV_NULL;
		return literal(c, "null") ? 0 : -EINVAL;
	case 't':
		f->type = DPTP_AV_BOOL;
		f->i = 1;
		return literal(c, "true") ? 0 : -EINVAL;
	case 'f':
		f->type = DPTP_AV_BOOL;
		f->i = 0;
		return literal(c, "false") ? 0 : -EINVAL;
	default:
		if (parse_number(c, &f->i, &f->d, &is_int) < 0)
			return -EINVAL;
		f->type = is_int ? DPTP_AV_INT : DPTP_AV_NUM;
		return 0;
	}
}

/* The record at c (a whole line) into r. */
static int parse_record(struct cursor *c, struct dptp_audit_rec *r)
{
	skip_ws(c);
	if (c->p >= c->end || *c->p++ != '{')
		return -EINVAL;
	skip_ws(c);
	if (c->p < c->end && *c->p == '}')
		return 0;
	for (;;) {
		struct dptp_audit_field *f;
		size_t klen;
		if (r->nfields == DPTP_AUDIT_MAX_FIELDS)
			return -EINVAL;
		f = &r->f[r->nfields];
		skip_ws(c);
		if (c->p >= c->end || *c->p != '"' || parse_string(c, &f->key, &klen) < 0)
			return -EINVAL;
		skip_ws(c);
		if (c->p >= c->end || *c->p++ != ':')
			return -EINVAL;
		if (parse_value(c, f) < 0)
			return -EINVAL;
		r->nfields++;
		skip_ws(c);
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			continue;
		}
		if (c->p < c->end && *c->p == '}')
			break;
		return -EINVAL;
	}
	c->p++;
	skip_ws(c);
	return c->p == c->end ? 0 : -EINVAL;
}

int dptp_audit_rec_parse(const char *line, size_t len, struct dptp_audit_rec *r)
{
	memset(r, 0, sizeof(*r));
	/* unescaped strings are never longer than their source, and an array
	 * has at most one element per two bytes */
	r->buf = malloc(len + 1);
	r->arr = malloc((len / 2 + 1) * sizeof(*r->arr));
	if (!r->buf || !r->arr)
		return -ENOMEM;
	struct cursor c = {.p = line, .end = line + len, .out = r->buf, .aout = r->arr};
	int rc = parse_record(&c, r);
	dptp_buf_release(&c.tmp);
	return rc;
}

void dptp_audit_rec_release(struct dptp_audit_rec *r)
{
	if (!r)
		return;
	free(r->buf);
	free(r->arr);
	memset(r, 0, sizeof(*r));
}

const struct dptp_audit_field *dptp_audit_rec_get(const struct dptp_audit_rec *r, const char *key)
{
	for (size_t i = 0; i < r->nfields; i++)
		if (!strcmp(r->f[i].key, key))
			return &r->f[i];
	return NULL;
}

const char *dptp_audit_rec_str(const struct dptp_audit_rec *r, const char *key, const char *dflt)
{
	const struct dptp_audit_field *f = dptp_audit_rec_get(r, key);
	return f && f->type == DPTP_AV_STR ? f->s : dflt;
}

int64_t dptp_audit_rec_int(const struct dptp_audit_rec *r, const char *key, int64_t dflt)
{
	const struct dptp_audit_field *f = dptp_audit_rec_get(r, key);
	return f && (f->type == DPTP_AV_INT || f->type == DPTP_AV_BOOL) ? f->i : dflt;
}

bool dptp_audit_rec_has(const struct dptp_audit_rec *r, const char *key)
{
	const struct dptp_audit_field *f = dptp_audit_rec_get(r, key);
	return f && f->type != DPTP_AV_NULL;
}
