/* The audit's record format: the parser (see audit_rec.h). */
#include "base/audit_rec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct cursor {
	const char *p, *end;
	char *out;       /* next free byte of r->buf */
	int64_t *aout;   /* next free element of r->arr */
};

static void skip_ws(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n'))
		c->p++;
}

static int hexval(char h)
{
	if (h >= '0' && h <= '9')
		return h - '0';
	if (h >= 'a' && h <= 'f')
		return h - 'a' + 10;
	if (h >= 'A' && h <= 'F')
		return h - 'A' + 10;
	return -1;
}

/* A JSON string at c->p (after its opening quote was checked), unescaped
 * into c->out; \uXXXX as UTF-8 (surrogates as U+FFFD). */
static int parse_string(struct cursor *c, const char **s, size_t *n)
{
	char *o = c->out;
	c->p++;
	*s = o;
	while (c->p < c->end && *c->p != '"') {
		unsigned char ch = (unsigned char)*c->p++;
		if (ch != '\\') {
			*o++ = (char)ch;
			continue;
		}
		if (c->p >= c->end)
			return -EINVAL;
		ch = (unsigned char)*c->p++;
		switch (ch) {
		case 'n': *o++ = '\n'; break;
		case 't': *o++ = '\t'; break;
		case 'r': *o++ = '\r'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case '"': case '\\': case '/': *o++ = (char)ch; break;
		case 'u': {
			unsigned v = 0;
			if (c->end - c->p < 4)
				return -EINVAL;
			for (int k = 0; k < 4; k++) {
				int h = hexval(c->p[k]);
				if (h < 0)
					return -EINVAL;
				v = v << 4 | (unsigned)h;
			}
			c->p += 4;
			if (v >= 0xd800 && v < 0xe000)
				v = 0xfffd;
			if (v < 0x80) {
				*o++ = (char)v;
			} else if (v < 0x800) {
				*o++ = (char)(0xc0 | v >> 6);
				*o++ = (char)(0x80 | (v & 0x3f));
			} else {
				*o++ = (char)(0xe0 | v >> 12);
				*o++ = (char)(0x80 | ((v >> 6) & 0x3f));
				*o++ = (char)(0x80 | (v & 0x3f));
			}
			break;
		}
		default:
			return -EINVAL;
		}
	}
	if (c->p >= c->end)
		return -EINVAL;
	c->p++;
	*n = (size_t)(o - *s);
	*o++ = '\0';
	c->out = o;
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
	skip_ws(&c);
	if (c.p >= c.end || *c.p++ != '{')
		return -EINVAL;
	skip_ws(&c);
	if (c.p < c.end && *c.p == '}')
		return 0;
	for (;;) {
		struct dptp_audit_field *f;
		size_t klen;
		if (r->nfields == DPTP_AUDIT_MAX_FIELDS)
			return -EINVAL;
		f = &r->f[r->nfields];
		skip_ws(&c);
		if (c.p >= c.end || *c.p != '"' || parse_string(&c, &f->key, &klen) < 0)
			return -EINVAL;
		skip_ws(&c);
		if (c.p >= c.end || *c.p++ != ':')
			return -EINVAL;
		if (parse_value(&c, f) < 0)
			return -EINVAL;
		r->nfields++;
		skip_ws(&c);
		if (c.p < c.end && *c.p == ',') {
			c.p++;
			continue;
		}
		if (c.p < c.end && *c.p == '}')
			break;
		return -EINVAL;
	}
	c.p++;
	skip_ws(&c);
	return c.p == c.end ? 0 : -EINVAL;
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
