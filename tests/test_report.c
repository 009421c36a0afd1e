/* Report writers: JSON parsed back by a small validating parser, escaping
 * of every byte, JUnit well-formedness and counts, the text table, the
 * verdict helpers and the atomic file writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <locale.h>
#include <wchar.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/report.h"

/* ---- a small strict JSON parser ------------------------------------ */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype t;
	double num;
	bool b;
	char *s;          /* decoded string (J_STR), NUL-terminated */
	size_t slen;
	size_t n;         /* items (J_ARR, J_OBJ) */
	char **keys;      /* J_OBJ */
	struct jv **items;
};

struct jp {
	const unsigned char *p, *end;
	bool ok;
};

static void jfree(struct jv *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->n; i++) {
		jfree(v->items[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->items);
	free(v->keys);
	free(v->s);
	free(v);
}

static void ws(struct jp *p)
{
	while (p->p < p->end && (*p->p == ' ' || *p->p == '\t' || *p->p == '\n' || *p->p == '\r'))
		p->p++;
}

/* Well-formed UTF-8 sequence length at s, 0 if not. The oracle is the C
 * library's decoder (mbrtowc in a UTF-8 locale), not a copy of ours. */
static size_t u8len(const unsigned char *s, size_t n)
{
	mbstate_t st;
	memset(&st, 0, sizeof(st));
	wchar_t wc;
	size_t r = mbrtowc(&wc, (const char *)s, n, &st);
	if (r == (size_t)-1 || r == (size_t)-2)
		return 0;
	if ((uint32_t)wc > 0x10ffff) /* glibc decodes up to 31 bits; Unicode ends here */
		return 0;
	return r == 0 ? 1 : r; /* r == 0: the NUL character, one byte */
}

static bool valid_utf8(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		size_t l = u8len(u + i, n - i);
		if (!l)
			return false;
		i += l;
	}
	return true;
}

static size_t put_utf8(char *o, uint32_t cp)
{
	mbstate_t st;
	memset(&st, 0, sizeof(st));
	size_t r = wcrtomb(o, (wchar_t)cp, &st);
	return r == (size_t)-1 ? 0 : r;
}

static int hex4(struct jp *p, uint32_t *out)
{
	if (p->end - p->p < 4)
		return -1;
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		unsigned char c = p->p[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
			c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		v = v * 16 + (uint32_t)d;
	}
	p->p += 4;
	*out = v;
	return 0;
}

/* Parses a string at p->p (on the opening quote); NULL on any error. */
static char *jstring(struct jp *p, size_t *len)
{
	if (p->p >= p->end || *p->p != '"')
		return NULL;
	p->p++;
	char *o = malloc((size_t)(p->end - p->p) * 2 + 8);
	size_t k = 0;
	while (p->p < p->end && *p->p != '"') {
		unsigned char c = *p->p;
		if (c < 0x20)
			goto bad;  /* raw control byte */
		if (c != '\\') {
			size_t l = u8len(p->p, (size_t)(p->end - p->p));
			if (!l)
				goto bad;  /* invalid UTF-8 in the output */
			memcpy(o + k, p->p, l);
			k += l;
			p->p += l;
			continue;
		}
		p->p++;
		if (p->p >= p->end)
			goto bad;
		c = *p->p++;
		switch (c) {
		case '"': o[k++] = '"'; break;
		case '\\': o[k++] = '\\'; break;
		case '/': o[k++] = '/'; break;
		case 'b': o[k++] = '\b'; break;
		case 'f': o[k++] = '\f'; break;
		case 'n': o[k++] = '\n'; break;
		case 'r': o[k++] = '\r'; break;
		case 't': o[k++] = '\t'; break;
		case 'u': {
			uint32_t cp, lo;
			if (hex4(p, &cp))
				goto bad;
			if (cp >= 0xdc00 && cp <= 0xdfff)
				goto bad;
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (p->end - p->p < 6 || p->p[0] != '\\' || p->p[1] != 'u')
					goto bad;
				p->p += 2;
				if (hex4(p, &lo) || lo < 0xdc00 || lo > 0xdfff)
					goto bad;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			}
			k += put_utf8(o + k, cp);
			break;
		}
		default:
			goto bad;
		}
	}
	if (p->p >= p->end)
		goto bad;
	p->p++;
	o[k] = 0;
	*len = k;
	return o;
bad:
	free(o);
	return NULL;
}

static struct jv *jvalue(struct jp *p, int depth);

static struct jv *jnew(enum jtype t)
{
	struct jv *v = calloc(1, sizeof(*v));
	v->t = t;
	return v;
}

static void jpush(struct jv *v, char *key, struct jv *item)
{
	v->items = realloc(v->items, sizeof(*v->items) * (v->n + 1));
	if (v->t == J_OBJ)
		v->keys = realloc(v->keys, sizeof(*v->keys) * (v->n + 1));
	v->items[v->n] = item;
	if (v->t == J_OBJ)
		v->keys[v->n] = key;
	v->n++;
}

static struct jv *jvalue(struct jp *p, int depth)
{
	ws(p);
	if (p->p >= p->end || depth > 64)
		return NULL;
	unsigned char c = *p->p;
	if (c == '{' || c == '[') {
		struct jv *v = jnew(c == '{' ? J_OBJ : J_ARR);
		char close = c == '{' ? '}' : ']';
		p->p++;
		ws(p);
		if (p->p < p->end && *p->p == close) {
			p->p++;
			return v;
		}
		for (;;) {
			char *key = NULL;
			if (v->t == J_OBJ) {
				size_t kl;
				ws(p);
				key = jstring(p, &kl);
				ws(p);
				if (!key || p->p >= p->end || *p->p != ':') {
					free(key);
					jfree(v);
					return NULL;
				}
				p->p++;
			}
			struct jv *item = jvalue(p, depth + 1);
			if (!item) {
				free(key);
				jfree(v);
				return NULL;
			}
			jpush(v, key, item);
			ws(p);
			if (p->p < p->end && *p->p == ',') {
				p->p++;
				continue;
			}
			if (p->p < p->end && *p->p == close) {
				p->p++;
				return v;
			}
			jfree(v);
			return NULL;
		}
	}
	if (c == '"') {
		struct jv *v = jnew(J_STR);
		v->s = jstring(p, &v->slen);
		if (!v->s) {
			jfree(v);
			return NULL;
		}
		return v;
	}
	static const char *const words[] = { "null", "true", "false" };
	for (int i = 0; i < 3; i++) {
		size_t l = strlen(words[i]);
		if ((size_t)(p->end - p->p) >= l && memcmp(p->p, words[i], l) == 0) {
			p->p += l;
			struct jv *v = jnew(i == 0 ? J_NULL : J_BOOL);
			v->b = i == 1;
			return v;
		}
	}
	/* number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
	const unsigned char *s = p->p;
	if (s < p->end && *s == '-')
		s++;
	if (s >= p->end || !(*s >= '0' && *s <= '9'))
		return NULL;
	if (*s == '0')
		s++;
	else
		while (s < p->end && *s >= '0' && *s <= '9')
			s++;
	if (s < p->end && *s == '.') {
		s++;
		if (s >= p->end || !(*s >= '0' && *s <= '9'))
			return NULL;
		while (s < p->end && *s >= '0' && *s <= '9')
			s++;
	}
	if (s < p->end && (*s == 'e' || *s == 'E')) {
		s++;
		if (s < p->end && (*s == '+' || *s == '-'))
			s++;
		if (s >= p->end || !(*s >= '0' && *s <= '9'))
			return NULL;
		while (s < p->end && *s >= '0' && *s <= '9')
			s++;
	}
	char buf[64];
	size_t l = (size_t)(s - p->p);
	if (l >= sizeof(buf))
		return NULL;
	memcpy(buf, p->p, l);
	buf[l] = 0;
	p->p = s;
	struct jv *v = jnew(J_NUM);
	v->num = strtod(buf, NULL);
	return v;
}

/* Parses a whole document; fails the test if it is not valid JSON. */
static struct jv *jparse(const char *text, size_t n)
{
	struct jp p = { (const unsigned char *)text, (const unsigned char *)text + n, true };
	struct jv *v = jvalue(&p, 0);
	if (v) {
		ws(&p);
		if (p.p != p.end) {
			jfree(v);
			v = NULL;
		}
	}
	if (!v)
		fail_msg("not valid JSON at byte %zu: %.*s", (size_t)(p.p - (const unsigned char *)text),
			 (int)(n > 400 ? 400 : n), text);
	return v;
}

static struct jv *jget(const struct jv *o, const char *key)
{
	assert_int_equal(o->t, J_OBJ);
	for (size_t i = 0; i < o->n; i++)
		if (strcmp(o->keys[i], key) == 0)
			return o->items[i];
	return NULL;
}

static struct jv *jat(const struct jv *a, size_t i)
{
	assert_int_equal(a->t, J_ARR);
	assert_true(i < a->n);
	return a->items[i];
}

static const char *jstr(const struct jv *o, const char *key)
{
	struct jv *v = jget(o, key);
	assert_non_null(v);
	assert_int_equal(v->t, J_STR);
	return v->s;
}

static double jnum(const struct jv *o, const char *key)
{
	struct jv *v = jget(o, key);
	assert_non_null(v);
	assert_int_equal(v->t, J_NUM);
	return v->num;
}

/* ---- capture helpers ------------------------------------------------ */

struct cap {
	char *buf;
	size_t len;
	FILE *f;
};

static void cap_open(struct cap *c)
{
	c->buf = NULL;
	c->len = 0;
	c->f = open_memstream(&c->buf, &c->len);
	assert_non_null(c->f);
}

static void cap_close(struct cap *c)
{
	assert_int_equal(fclose(c->f), 0);
}

static char *json_escaped(const char *s, size_t n, size_t *len)
{
	struct cap c;
	cap_open(&c);
	fputc('"', c.f);
	dptp_json_escape(c.f, s, n);
	fputc('"', c.f);
	cap_close(&c);
	*len = c.len;
	return c.buf;
}

static char *xml_escaped(const char *s, size_t n)
{
	struct cap c;
	cap_open(&c);
	dptp_xml_escape(c.f, s, n);
	cap_close(&c);
	return c.buf;
}

/* ---- a small XML well-formedness checker ---------------------------- */

static bool xml_chars_ok(const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		size_t l = u8len(u + i, n - i);
		if (!l)
			return false;
		if (l == 1 && u[i] < 0x20 && u[i] != '\t' && u[i] != '\n' && u[i] != '\r')
			return false;
		if (l == 3 && u[i] == 0xef && u[i + 1] == 0xbf && (u[i + 2] == 0xbe || u[i + 2] == 0xbf))
			return false;  /* U+FFFE, U+FFFF */
		i += l;
	}
	return true;
}

/* At an '&': a known entity or a character reference. */
static size_t xml_entity(const char *s)
{
	static const char *const ents[] = { "&amp;", "&lt;", "&gt;", "&quot;", "&apos;" };
	for (size_t i = 0; i < 5; i++)
		if (strncmp(s, ents[i], strlen(ents[i])) == 0)
			return strlen(ents[i]);
	if (s[1] == '#') {
		size_t i = 2;
		bool hex = s[2] == 'x';
		if (hex)
			i++;
		size_t start = i;
		while (hex ? strchr("0123456789abcdefABCDEF", s[i]) && s[i] : (s[i] >= '0' && s[i] <= '9'))
			i++;
		if (i > start && s[i] == ';')
			return i + 1;
	}
	return 0;
}

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_' || c == ':' || c == '.';
}

/* Fails the test unless doc is well-formed (for the subset we write). */
static void xml_check(const char *doc)
{
	assert_true(xml_chars_ok(doc, strlen(doc)));
	const char *p = doc;
	if (strncmp(p, "<?xml", 5) == 0) {
		p = strstr(p, "?>");
		assert_non_null(p);
		p += 2;
	}
	char stack[16][64];
	int depth = 0, roots = 0;
	while (*p) {
		if (*p == '&') {
			size_t l = xml_entity(p);
			if (!l)
				fail_msg("bad entity at: %.20s", p);
			p += l;
			continue;
		}
		if (*p == '>')
			fail_msg("raw '>' in text at: %.20s", p);
		if (*p != '<') {
			if (depth == 0 && !(*p == ' ' || *p == '\n'))
				fail_msg("text outside the root: %.20s", p);
			p++;
			continue;
		}
		p++;
		bool closing = *p == '/';
		if (closing)
			p++;
		const char *name = p;
		while (name_char(*p))
			p++;
		size_t nl = (size_t)(p - name);
		assert_true(nl > 0 && nl < 64);
		if (closing) {
			assert_true(depth > 0);
			depth--;
			if (strlen(stack[depth]) != nl || strncmp(stack[depth], name, nl) != 0)
				fail_msg("</%.*s> closes <%s>", (int)nl, name, stack[depth]);
			assert_int_equal(*p, '>');
			p++;
			continue;
		}
		/* attributes */
		char seen[16][64];
		int nseen = 0;
		for (;;) {
			while (*p == ' ' || *p == '\n')
				p++;
			if (*p == '/' || *p == '>')
				break;
			const char *an = p;
			while (name_char(*p))
				p++;
			size_t al = (size_t)(p - an);
			assert_true(al > 0 && al < 64);
			for (int i = 0; i < nseen; i++)
				if (strlen(seen[i]) == al && strncmp(seen[i], an, al) == 0)
					fail_msg("attribute %.*s repeated", (int)al, an);
			assert_true(nseen < 16);
			memcpy(seen[nseen], an, al);
			seen[nseen++][al] = 0;
			assert_int_equal(*p++, '=');
			assert_int_equal(*p++, '"');
			while (*p != '"') {
				assert_true(*p);
				assert_true(*p != '<');
				if (*p == '&') {
					size_t l = xml_entity(p);
					if (!l)
						fail_msg("bad entity in attribute at: %.20s", p);
					p += l;
				} else {
					p++;
				}
			}
			p++;
		}
		if (depth == 0)
			roots++;
		if (*p == '/') {
			p++;
			assert_int_equal(*p, '>');
			p++;
			continue;
		}
		p++;
		assert_true(depth < 16);
		memcpy(stack[depth], name, nl);
		stack[depth++][nl] = 0;
	}
	assert_int_equal(depth, 0);
	assert_int_equal(roots, 1);
}

/* Value of attribute attr in the first element <elem ...> at or after s. */
static int xml_int_attr(const char *s, const char *elem, const char *attr)
{
	char open[64], key[64];
	snprintf(open, sizeof(open), "<%s ", elem);
	snprintf(key, sizeof(key), " %s=\"", attr);
	const char *e = strstr(s, open);
	assert_non_null(e);
	const char *end = strchr(e, '>');
	const char *a = strstr(e, key);
	assert_non_null(a);
	assert_true(a < end);
	return atoi(a + strlen(key));
}

static int count(const char *s, const char *needle)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* ---- a sample report ------------------------------------------------ */

static const char *const check_names[] = { "broadcast", "opid", "device-map", "fused-allreduce", "dispatch" };

/* 256 bytes 0x00..0xff, then hostile ASCII. */
static char hostile[256 + 64];
static size_t hostile_len;

static void make_hostile(void)
{
	for (int i = 0; i < 256; i++)
		hostile[i] = (char)i;
	const char *tail = "\"\\]]><&'/\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe2\x82";
	memcpy(hostile + 256, tail, strlen(tail));
	hostile_len = 256 + strlen(tail);
}

/* The detail of a check is a C string: a NUL cuts it. */
static char *hostile_detail(void)
{
	char *d = malloc(hostile_len + 1);
	memcpy(d, hostile + 1, hostile_len - 1);  /* skip the NUL */
	d[hostile_len - 1] = 0;
	return d;
}

static void fill(struct dptp_report *r, bool engine, const struct dptp_bench_row *bench, size_t nbench,
		 const enum dptp_status st[2][5])
{
	static const char *const inject[] = { "bcast-global-src" };
	memset(r, 0, sizeof(*r));
	r->tool = "dptp-check";
	r->version = "0.1.0";
	r->world = 4, r->dp = 2, r->pp = 1, r->tp = 2;
	r->backend = "host";
	r->bootstrap = "pmix";
	r->engine = engine ? "mpirun" : NULL;
	r->seed = 18446744073709551615ULL;
	r->ninject = 1;
	r->inject = inject;
	r->nreplicas = 2;
	r->replicas = calloc(2, sizeof(*r->replicas));
	for (int d = 0; d < 2; d++) {
		struct dptp_replica_result *rep = &r->replicas[d];
		rep->dp = d;
		rep->nranks = 2;
		rep->ranks = malloc(2 * sizeof(int));
		rep->ranks[0] = 2 * d;
		rep->ranks[1] = 2 * d + 1;
		rep->nchecks = 5;
		rep->checks = calloc(5, sizeof(*rep->checks));
		rep->status = DPTP_SKIP;
		for (int c = 0; c < 5; c++) {
			struct dptp_check_result *cr = &rep->checks[c];
			snprintf(cr->name, sizeof(cr->name), "%s", check_names[c]);
			cr->status = st[d][c];
			cr->seconds = 0.0012 * (c + 1);
			cr->detail = (d == 1 && c == 0) ? hostile_detail() : strdup(c == 1 ? "a\nsecond line" : "");
			rep->status = dptp_status_worst(rep->status, cr->status);
		}
	}
	r->nbench = nbench;
	r->bench = (struct dptp_bench_row *)bench;
}

static const enum dptp_status mixed[2][5] = {
	{ DPTP_PASS, DPTP_PASS, DPTP_PASS, DPTP_SKIP, DPTP_PASS },
	{ DPTP_FAIL, DPTP_PASS, DPTP_ERROR, DPTP_TIMEOUT, DPTP_PASS },
};

static const enum dptp_status allpass[2][5] = {
	{ DPTP_PASS, DPTP_PASS, DPTP_PASS, DPTP_PASS, DPTP_PASS },
	{ DPTP_PASS, DPTP_PASS, DPTP_PASS, DPTP_PASS, DPTP_PASS },
};

/* ---- tests ----------------------------------------------------------- */

static void test_status_names(void **state)
{
	const char *names[] = { "skip", "pass", "fail", "error", "timeout" };
	for (int i = 0; i < 5; i++) {
		assert_string_equal(dptp_status_name((enum dptp_status)i), names[i]);
		assert_int_equal(dptp_status_parse(names[i]), i);
	}
	assert_int_equal(dptp_status_parse("PASS"), -1);
	assert_int_equal(dptp_status_parse(""), -1);
	assert_int_equal(dptp_status_worst(DPTP_PASS, DPTP_SKIP), DPTP_PASS);
	assert_int_equal(dptp_status_worst(DPTP_FAIL, DPTP_ERROR), DPTP_ERROR);
	assert_int_equal(dptp_status_worst(DPTP_TIMEOUT, DPTP_ERROR), DPTP_TIMEOUT);
}

static void set_all(struct dptp_report *r, enum dptp_status s)
{
	for (size_t i = 0; i < r->nreplicas; i++) {
		r->replicas[i].status = s;
		for (size_t j = 0; j < r->replicas[i].nchecks; j++)
			r->replicas[i].checks[j].status = s;
	}
}

static void test_summary_and_exit_code(void **state)
{
	struct dptp_report r;
	memset(&r, 0, sizeof(r));
	/* nothing checked (results lost on the way) is no pass */
	assert_int_equal(dptp_report_worst(&r), DPTP_ERROR);
	assert_int_equal(dptp_report_exit_code(&r), 3);
	struct dptp_replica_result none = { .dp = 0, .status = DPTP_PASS };
	r.nreplicas = 1;
	r.replicas = &none;
	assert_int_equal(dptp_report_exit_code(&r), 3);
	r.nreplicas = 0;
	r.replicas = NULL;

	fill(&r, false, NULL, 0, mixed);
	struct dptp_summary s = dptp_report_summary(&r);
	assert_int_equal(s.pass, 6);
	assert_int_equal(s.fail, 1);
	assert_int_equal(s.skip, 1);
	assert_int_equal(s.error, 1);
	assert_int_equal(s.timeout, 1);
	assert_int_equal(dptp_report_worst(&r), DPTP_TIMEOUT);
	assert_int_equal(dptp_report_exit_code(&r), 4);

	set_all(&r, DPTP_SKIP);
	assert_int_equal(dptp_report_exit_code(&r), 0);
	set_all(&r, DPTP_PASS);
	assert_int_equal(dptp_report_exit_code(&r), 0);
	r.replicas[0].checks[2].status = DPTP_FAIL;
	assert_int_equal(dptp_report_exit_code(&r), 1);
	r.replicas[1].checks[4].status = DPTP_ERROR;
	assert_int_equal(dptp_report_exit_code(&r), 3);   /* error beats fail */
	r.replicas[1].checks[0].status = DPTP_TIMEOUT;
	assert_int_equal(dptp_report_exit_code(&r), 4);   /* timeout beats error */
	dptp_report_release(&r);
	assert_null(r.replicas);
	assert_int_equal(r.nreplicas, 0);
	dptp_report_release(&r);
	dptp_report_release(NULL);
}

/* Every byte alone: valid JSON, and it decodes to itself (ASCII) or to
 * U+FFFD (a lone byte >= 0x80 is never valid UTF-8). */
static void test_json_escape_every_byte(void **state)
{
	for (int b = 0; b < 256; b++) {
		char in = (char)b;
		size_t len;
		char *out = json_escaped(&in, 1, &len);
		for (size_t i = 0; i < len; i++) {
			assert_true((unsigned char)out[i] >= 0x20);
			assert_true((unsigned char)out[i] != 0x7f);
		}
		struct jv *v = jparse(out, len);
		assert_int_equal(v->t, J_STR);
		if (b < 0x80) {
			assert_int_equal(v->slen, 1);
			assert_int_equal((unsigned char)v->s[0], b);
		} else {
			assert_string_equal(v->s, "\xef\xbf\xbd");
		}
		jfree(v);
		free(out);
	}
}

static void expect_json(const char *in, size_t n, const char *want)
{
	size_t len;
	char *out = json_escaped(in, n, &len);
	assert_string_equal(out, want);
	free(out);
}

static void test_json_escape_exact(void **state)
{
	expect_json("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
	expect_json("\n\t\x01\x1f\x7f", 5, "\"\\u000a\\u0009\\u0001\\u001f\\u007f\"");
	expect_json("\0x", 2, "\"\\u0000x\"");
	expect_json("</script>]]>", 12, "\"</script>]]>\"");
	/* valid UTF-8 passes through */
	expect_json("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
	/* overlong, surrogate, above U+10FFFF, truncated, stray continuation */
	expect_json("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");
	expect_json("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");
	expect_json("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
	expect_json("a\xe2\x82", 3, "\"a\\ufffd\\ufffd\"");
	expect_json("\x80z", 2, "\"\\ufffdz\"");
	expect_json("\xe2\x80\xa8", 3, "\"\\u2028\"");
	expect_json("", 0, "\"\"");
}

static void test_json_escape_all_bytes(void **state)
{
	size_t len;
	char *out = json_escaped(hostile, hostile_len, &len);
	struct jv *v = jparse(out, len);
	assert_int_equal(v->t, J_STR);
	/* 128 ASCII bytes, then 128 lone high bytes each -> U+FFFD */
	assert_true(v->slen > 128 + 128 * 3);
	for (int i = 0; i < 128; i++)
		assert_int_equal((unsigned char)v->s[i], i);
	for (int i = 0; i < 128; i++)
		assert_memory_equal(v->s + 128 + 3 * i, "\xef\xbf\xbd", 3);
	assert_true(valid_utf8(v->s, v->slen));
	jfree(v);
	free(out);
}

static void test_xml_escape_exact(void **state)
{
	char *o = xml_escaped("<a&b>\"'", 7);
	assert_string_equal(o, "&lt;a&amp;b&gt;&quot;&apos;");
	free(o);
	o = xml_escaped("x]]>y", 5);
	assert_string_equal(o, "x]]&gt;y");
	free(o);
	o = xml_escaped("t\tn\nr\r", 6);
	assert_string_equal(o, "t\tn\nr&#13;");
	free(o);
	o = xml_escaped("\x01\x1b\x7f", 3);
	assert_string_equal(o, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	free(o);
	o = xml_escaped("\0", 1);
	assert_string_equal(o, "\xef\xbf\xbd");
	free(o);
	o = xml_escaped("\xef\xbf\xbe\xc3\xa9\xff", 6);   /* U+FFFE, é, 0xff */
	assert_string_equal(o, "\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd");
	free(o);
	o = xml_escaped("\xed\xa0\x80", 3);
	assert_string_equal(o, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	free(o);
}

static void test_xml_escape_every_byte(void **state)
{
	for (int b = 0; b < 256; b++) {
		char in[3] = { 'a', (char)b, 0 };
		char *o = xml_escaped(in, 2);
		char doc[64];
		snprintf(doc, sizeof(doc), "<r>%s</r>", o);
		xml_check(doc);
		free(o);
	}
	char *o = xml_escaped(hostile, hostile_len);
	char *doc = malloc(strlen(o) + 16);
	sprintf(doc, "<r>%s</r>", o);
	xml_check(doc);
	free(doc);
	free(o);
}

static char *render_json(const struct dptp_report *r)
{
	struct cap c;
	cap_open(&c);
	assert_int_equal(dptp_report_write_json(r, c.f), 0);
	cap_close(&c);
	return c.buf;
}

static void test_json_report(void **state)
{
	struct dptp_bench_row bench[2] = {
		{ .tp = 2, .tokens = 128, .hidden = 4096, .dtype = "bf16", .fused_us = 10.5,
		  .unfused_us = 21, .speedup = 2, .fused_busbw_gbs = 100, .unfused_busbw_gbs = 50 },
		{ .tp = 2, .tokens = 256, .hidden = 4096, .dtype = "bf16", .fused_us = 1.0 / 0.0 },
	};
	struct dptp_report r;
	fill(&r, true, bench, 2, mixed);
	r.replicas[0].checks[0].seconds = 0.0 / 0.0;  /* NaN: still valid JSON */
	char *text = render_json(&r);
	struct jv *v = jparse(text, strlen(text));

	static const char *const keys[] = { "tool", "version", "layout", "backend", "bootstrap",
		"engine", "seed", "inject", "replicas", "bench", "summary" };
	assert_int_equal(v->t, J_OBJ);
	assert_int_equal(v->n, DPTP_ARRAY_LEN(keys));
	for (size_t i = 0; i < v->n; i++)
		assert_string_equal(v->keys[i], keys[i]);

	assert_string_equal(jstr(v, "tool"), "dptp-check");
	assert_string_equal(jstr(v, "version"), "0.1.0");
	struct jv *lay = jget(v, "layout");
	static const char *const lkeys[] = { "world", "dp", "pp", "tp" };
	const double lwant[] = { 4, 2, 1, 2 };
	assert_int_equal(lay->n, 4);
	for (int i = 0; i < 4; i++) {
		assert_string_equal(lay->keys[i], lkeys[i]);
		assert_true(lay->items[i]->num == lwant[i]);
	}
	assert_string_equal(jstr(v, "backend"), "host");
	assert_string_equal(jstr(v, "bootstrap"), "pmix");
	assert_string_equal(jstr(v, "engine"), "mpirun");
	assert_non_null(strstr(text, "\"seed\": 18446744073709551615,"));
	assert_string_equal(jat(jget(v, "inject"), 0)->s, "bcast-global-src");

	struct jv *reps = jget(v, "replicas");
	assert_int_equal(reps->n, 2);
	static const char *const rkeys[] = { "dp", "ranks", "status", "checks" };
	static const char *const ckeys[] = { "name", "status", "seconds", "detail" };
	for (size_t d = 0; d < 2; d++) {
		struct jv *rep = jat(reps, d);
		assert_int_equal(rep->n, 4);
		for (int i = 0; i < 4; i++)
			assert_string_equal(rep->keys[i], rkeys[i]);
		assert_true(jnum(rep, "dp") == (double)d);
		struct jv *ranks = jget(rep, "ranks");
		assert_int_equal(ranks->n, 2);
		assert_true(jat(ranks, 0)->num == 2.0 * (double)d);
		assert_true(jat(ranks, 1)->num == 2.0 * (double)d + 1);
		assert_string_equal(jstr(rep, "status"), d == 0 ? "pass" : "timeout");
		struct jv *checks = jget(rep, "checks");
		assert_int_equal(checks->n, 5);
		for (size_t c = 0; c < 5; c++) {
			struct jv *ck = jat(checks, c);
			assert_int_equal(ck->n, 4);
			for (int i = 0; i < 4; i++)
				assert_string_equal(ck->keys[i], ckeys[i]);
			assert_string_equal(jstr(ck, "name"), check_names[c]);
			assert_string_equal(jstr(ck, "status"), dptp_status_name(mixed[d][c]));
			if (!(d == 0 && c == 0))
				assert_true(jnum(ck, "seconds") > 0.0012 * (double)(c + 1) - 1e-9 &&
					    jnum(ck, "seconds") < 0.0012 * (double)(c + 1) + 1e-9);
		}
		assert_true(jnum(jat(checks, 0), "seconds") >= 0);
		assert_string_equal(jstr(jat(checks, 1), "detail"), "a\nsecond line");
	}
	/* the hostile detail: bytes 1..127 intact, every high byte U+FFFD */
	struct jv *hd = jget(jat(jget(jat(reps, 1), "checks"), 0), "detail");
	for (int i = 1; i < 128; i++)
		assert_int_equal((unsigned char)hd->s[i - 1], i);
	assert_memory_equal(hd->s + 127, "\xef\xbf\xbd", 3);
	assert_non_null(strstr(hd->s, "\"\\]]><&'/"));
	assert_true(valid_utf8(hd->s, hd->slen));

	struct jv *b = jget(v, "bench");
	assert_int_equal(b->n, 2);
	struct jv *b0 = jat(b, 0);
	static const char *const bkeys[] = { "tp", "tokens", "hidden", "dtype", "fused_us",
		"unfused_us", "speedup", "fused_busbw_gbs", "unfused_busbw_gbs" };
	assert_int_equal(b0->n, DPTP_ARRAY_LEN(bkeys));
	for (size_t i = 0; i < b0->n; i++)
		assert_string_equal(b0->keys[i], bkeys[i]);
	assert_string_equal(jstr(b0, "dtype"), "bf16");
	assert_true(jnum(b0, "fused_us") == 10.5);
	assert_true(jnum(b0, "speedup") == 2);

	struct jv *s = jget(v, "summary");
	static const char *const skeys[] = { "pass", "fail", "skip", "error", "timeout" };
	const double swant[] = { 6, 1, 1, 1, 1 };
	assert_int_equal(s->n, 5);
	for (int i = 0; i < 5; i++) {
		assert_string_equal(s->keys[i], skeys[i]);
		assert_true(s->items[i]->num == swant[i]);
	}
	jfree(v);
	free(text);
	dptp_report_release(&r);
}

static void test_json_optional_keys(void **state)
{
	struct dptp_report r;
	fill(&r, false, NULL, 0, allpass);
	char *text = render_json(&r);
	struct jv *v = jparse(text, strlen(text));
	assert_null(jget(v, "engine"));
	assert_null(jget(v, "bench"));
	assert_string_equal(v->keys[4], "bootstrap");
	assert_string_equal(v->keys[5], "seed");
	assert_string_equal(v->keys[v->n - 1], "summary");
	assert_true(jnum(jget(v, "summary"), "pass") == 10);
	jfree(v);
	free(text);

	/* an empty report is still a valid document */
	r.ninject = 0;
	size_t n = r.nreplicas;
	r.nreplicas = 0;
	text = render_json(&r);
	v = jparse(text, strlen(text));
	assert_int_equal(jget(v, "replicas")->n, 0);
	assert_int_equal(jget(v, "inject")->n, 0);
	jfree(v);
	free(text);
	r.nreplicas = n;
	dptp_report_release(&r);
}

static char *render_junit(const struct dptp_report *r)
{
	struct cap c;
	cap_open(&c);
	assert_int_equal(dptp_report_write_junit(r, c.f), 0);
	cap_close(&c);
	return c.buf;
}

static void test_junit(void **state)
{
	struct dptp_report r;
	fill(&r, true, NULL, 0, mixed);
	char *x = render_junit(&r);
	xml_check(x);
	assert_int_equal(xml_int_attr(x, "testsuites", "tests"), 10);
	assert_int_equal(xml_int_attr(x, "testsuites", "failures"), 1);
	assert_int_equal(xml_int_attr(x, "testsuites", "errors"), 2);
	assert_int_equal(xml_int_attr(x, "testsuites", "skipped"), 1);
	assert_int_equal(count(x, "<testsuite "), 2);
	assert_int_equal(count(x, "<testcase "), 10);
	assert_int_equal(count(x, "<failure "), 1);
	assert_int_equal(count(x, "<error "), 2);
	assert_int_equal(count(x, "<skipped "), 1);
	assert_non_null(strstr(x, "type=\"timeout\""));

	const char *s0 = strstr(x, "<testsuite name=\"dp0\"");
	const char *s1 = strstr(x, "<testsuite name=\"dp1\"");
	assert_non_null(s0);
	assert_non_null(s1);
	assert_int_equal(xml_int_attr(s0, "testsuite", "tests"), 5);
	assert_int_equal(xml_int_attr(s0, "testsuite", "failures"), 0);
	assert_int_equal(xml_int_attr(s0, "testsuite", "errors"), 0);
	assert_int_equal(xml_int_attr(s0, "testsuite", "skipped"), 1);
	assert_int_equal(xml_int_attr(s1, "testsuite", "tests"), 5);
	assert_int_equal(xml_int_attr(s1, "testsuite", "failures"), 1);
	assert_int_equal(xml_int_attr(s1, "testsuite", "errors"), 2);
	assert_int_equal(xml_int_attr(s1, "testsuite", "skipped"), 0);
	for (int d = 0; d < 2; d++)
		for (int c = 0; c < 5; c++) {
			char name[64];
			snprintf(name, sizeof(name), "name=\"dp%d/%s\"", d, check_names[c]);
			assert_int_equal(count(x, name), 1);
		}
	assert_non_null(strstr(x, " time=\""));
	assert_non_null(strstr(x, "<property name=\"ranks\" value=\"2,3\"/>"));
	/* the hostile detail is in the failure, escaped */
	assert_non_null(strstr(x, "&quot;\\]]&gt;&lt;&amp;&apos;/"));
	free(x);
	dptp_report_release(&r);

	fill(&r, false, NULL, 0, allpass);
	x = render_junit(&r);
	xml_check(x);
	assert_int_equal(xml_int_attr(x, "testsuites", "tests"), 10);
	assert_int_equal(xml_int_attr(x, "testsuites", "failures"), 0);
	assert_int_equal(count(x, "<failure"), 0);
	assert_null(strstr(x, "engine"));
	free(x);
	dptp_report_release(&r);
}

static char *render_text(const struct dptp_report *r, bool color, int verbose)
{
	struct cap c;
	cap_open(&c);
	assert_int_equal(dptp_report_write_text(r, c.f, color, verbose), 0);
	cap_close(&c);
	return c.buf;
}

/* --bench at TP 1: no allreduce to fuse, said plainly; no ratio, no
 * summary of zero replicas. */
static void test_text_bench_tp1(void **state)
{
	struct dptp_bench_row bench[2] = {
		{ .tp = 1, .tokens = 128, .hidden = 4096, .dtype = "bf16", .fused_us = 4.7,
		  .unfused_us = 4.8, .fused_busbw_gbs = 220, .unfused_busbw_gbs = 218 },
		{ .tp = 1, .tokens = 2048, .hidden = 8192, .dtype = "bf16", .fused_us = 38.1,
		  .unfused_us = 39.0, .fused_busbw_gbs = 880, .unfused_busbw_gbs = 860 },
	};
	struct dptp_report r;
	memset(&r, 0, sizeof(r));
	r.tool = "dptp-check";
	r.version = "0";
	r.world = r.dp = r.pp = r.tp = 1;
	r.backend = "cuda";
	r.bootstrap = "pmix";
	r.engine = "dptp-run";
	r.nbench = 2;
	r.bench = bench;
	char *t = render_text(&r, false, 0);
	assert_non_null(strstr(t, "no allreduce to fuse"));
	assert_null(strstr(t, "summary:"));
	assert_null(strstr(t, "0.00x"));  /* a speedup of nothing fused */
	assert_null(strstr(t, "fused vs unfused"));
	assert_non_null(strstr(t, "38.10"));
	free(t);
	t = render_json(&r);
	assert_non_null(strstr(t, "\"speedup\": null"));
	free(t);
	/* TP 2 rows keep their ratio */
	bench[0].tp = bench[1].tp = 2;
	bench[0].speedup = bench[1].speedup = 1.5;
	t = render_text(&r, false, 0);
	assert_null(strstr(t, "no allreduce to fuse"));
	assert_non_null(strstr(t, "1.50x"));
	free(t);
}

static void test_text(void **state)
{
	struct dptp_bench_row bench[1] = {
		{ .tp = 2, .tokens = 128, .hidden = 4096, .dtype = "bf16", .fused_us = 10.5,
		  .unfused_us = 21, .speedup = 2, .fused_busbw_gbs = 100, .unfused_busbw_gbs = 50 },
	};
	struct dptp_report r;
	fill(&r, true, bench, 1, mixed);
	for (int verbose = 0; verbose < 2; verbose++) {
		char *t = render_text(&r, false, verbose);
		assert_non_null(strstr(t, "DP replica 0 (ranks 0,1): PASS"));
		assert_non_null(strstr(t, "DP replica 1 (ranks 2,3): TIMEOUT"));
		for (int c = 0; c < 5; c++)
			assert_int_equal(count(t, check_names[c]), 2);
		assert_non_null(strstr(t, "world 4 = dp 2 x pp 1 x tp 2"));
		assert_non_null(strstr(t, "inject: bcast-global-src"));
		assert_non_null(strstr(t, "summary: 6 pass, 1 fail, 1 skip, 1 error, 1 timeout"));
		assert_non_null(strstr(t, "0.0012s"));
		assert_non_null(strstr(t, "bench"));
		assert_non_null(strstr(t, "4096"));
		/* no escape sequence and no raw control byte from the detail */
		for (const char *p = t; *p; p++)
			assert_true((unsigned char)*p >= 0x20 || *p == '\n');
		assert_non_null(strstr(t, "\\x01"));
		if (verbose)
			assert_non_null(strstr(t, "\\x1b"));
		assert_true(valid_utf8(t, strlen(t)));
		if (verbose)
			assert_non_null(strstr(t, "second line"));
		else
			assert_null(strstr(t, "second line"));
		free(t);
	}
	char *t = render_text(&r, true, 0);
	assert_non_null(strstr(t, "\033["));
	assert_non_null(strstr(t, "PASS\033[0m"));
	free(t);
	dptp_report_release(&r);

	/* ranks are compressed into ranges */
	fill(&r, false, NULL, 0, allpass);
	free(r.replicas[0].ranks);
	r.replicas[0].ranks = malloc(6 * sizeof(int));
	memcpy(r.replicas[0].ranks, (int[]){ 0, 1, 2, 3, 8, 10 }, 6 * sizeof(int));
	r.replicas[0].nranks = 6;
	t = render_text(&r, false, 0);
	assert_non_null(strstr(t, "(ranks 0-3,8,10): PASS"));
	free(t);
	dptp_report_release(&r);
}

/* ---- atomic file writes --------------------------------------------- */

static char *make_tmpdir(void)
{
	char tmpl[] = "/tmp/dptp-test-report-XXXXXX";
	char *d = mkdtemp(tmpl);
	assert_non_null(d);
	return strdup(d);
}

/* Names in dir, other than . and .. */
static int dir_entries(const char *dir, char names[][256], int max)
{
	DIR *dp = opendir(dir);
	assert_non_null(dp);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dp))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (n < max)
			snprintf(names[n], 256, "%s", e->d_name);
		n++;
	}
	closedir(dp);
	return n;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	struct cap c;
	cap_open(&c);
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, c.f);
	fclose(f);
	cap_close(&c);
	*len = c.len;
	return c.buf;
}

static void rm_rf(const char *dir)
{
	char names[16][256];
	int n = dir_entries(dir, names, 16);
	for (int i = 0; i < n && i < 16; i++) {
		char p[512];
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		if (rmdir(p) != 0)
			unlink(p);
	}
	rmdir(dir);
}

static void test_write_file(void **state)
{
	struct dptp_report r;
	fill(&r, true, NULL, 0, mixed);
	char *dir = make_tmpdir();
	char path[512];
	snprintf(path, sizeof(path), "%s/report.json", dir);
	struct dptp_err err = {0};

	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err), 0);
	char *want = render_json(&r);
	size_t len;
	char *got = slurp(path, &len);
	assert_int_equal(len, strlen(want));
	assert_memory_equal(got, want, len);
	free(got);
	char names[4][256];
	assert_int_equal(dir_entries(dir, names, 4), 1);
	assert_string_equal(names[0], "report.json");
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(st.st_mode & S_IRUSR);

	/* replacing an existing file: other formats, same single entry */
	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JUNIT, path, &err), 0);
	got = slurp(path, &len);
	char *x = render_junit(&r);
	assert_int_equal(len, strlen(x));
	assert_memory_equal(got, x, len);
	free(got);
	free(x);
	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_TEXT, path, &err), 0);
	assert_int_equal(dir_entries(dir, names, 4), 1);
	free(want);

	/* relative path (no slash): lands in the current directory */
	char cwd[512];
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0);
	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JSON, "rel.json", &err), 0);
	assert_int_equal(chdir(cwd), 0);
	assert_int_equal(dir_entries(dir, names, 4), 2);

	rm_rf(dir);
	free(dir);
	dptp_report_release(&r);
}

static void test_write_file_errors(void **state)
{
	struct dptp_report r;
	fill(&r, false, NULL, 0, allpass);
	char *dir = make_tmpdir();
	char path[512], names[4][256];
	struct dptp_err err = {0};

	/* missing folder */
	snprintf(path, sizeof(path), "%s/nope/report.json", dir);
	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err), -ENOENT);
	assert_non_null(strstr(err.msg, path));

	/* target is a folder: rename fails after the temp was written */
	snprintf(path, sizeof(path), "%s/sub", dir);
	assert_int_equal(mkdir(path, 0700), 0);
	memset(&err, 0, sizeof(err));
	int rc = dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err);
	assert_true(rc == -EISDIR || rc == -EEXIST || rc == -ENOTEMPTY);
	assert_non_null(strstr(err.msg, path));
	assert_int_equal(dir_entries(dir, names, 4), 1);
	assert_string_equal(names[0], "sub");

	/* a write error (file size limit): no temp file remains */
	struct rlimit old, lim;
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
	lim = old;
	lim.rlim_cur = 64;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	snprintf(path, sizeof(path), "%s/big.json", dir);
	memset(&err, 0, sizeof(err));
	rc = dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, oldsig);
	assert_int_equal(rc, -EFBIG);
	assert_non_null(strstr(err.msg, path));
	assert_int_equal(dir_entries(dir, names, 4), 1);

	/* an unwritable folder (only meaningful when not root) */
	if (geteuid() != 0) {
		assert_int_equal(chmod(dir, 0500), 0);
		snprintf(path, sizeof(path), "%s/report.json", dir);
		memset(&err, 0, sizeof(err));
		assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err), -EACCES);
		assert_non_null(strstr(err.msg, path));
		assert_int_equal(chmod(dir, 0700), 0);
		assert_int_equal(dir_entries(dir, names, 4), 1);
	}

	/* empty name, name ending in a slash */
	assert_int_equal(dptp_report_write_file(&r, DPTP_FORMAT_JSON, "", &err), -EINVAL);
	assert_string_equal(err.msg, "cannot write the report: empty file name");
	snprintf(path, sizeof(path), "%s/", dir);
	assert_true(dptp_report_write_file(&r, DPTP_FORMAT_JSON, path, &err) < 0);
	char want[600];
	snprintf(want, sizeof(want), "cannot write report '%s': names a directory", path);
	assert_string_equal(err.msg, want);
	assert_int_equal(dir_entries(dir, names, 4), 1);

	rm_rf(dir);
	free(dir);
	dptp_report_release(&r);
}

static int setup(void **state)
{
	make_hostile();
	return 0;
}

int main(void)
{
	/* the UTF-8 oracle (u8len, put_utf8) is the C library's */
	if (!setlocale(LC_CTYPE, "C.UTF-8") && !setlocale(LC_CTYPE, "en_US.UTF-8")) {
		fprintf(stderr, "test_report: no UTF-8 locale (C.UTF-8) for the oracle\n");
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_names),
		cmocka_unit_test(test_summary_and_exit_code),
		cmocka_unit_test(test_json_escape_every_byte),
		cmocka_unit_test(test_json_escape_exact),
		cmocka_unit_test(test_json_escape_all_bytes),
		cmocka_unit_test(test_xml_escape_exact),
		cmocka_unit_test(test_xml_escape_every_byte),
		cmocka_unit_test(test_json_report),
		cmocka_unit_test(test_json_optional_keys),
		cmocka_unit_test(test_junit),
		cmocka_unit_test(test_text),
		cmocka_unit_test(test_text_bench_tp1),
		cmocka_unit_test(test_write_file),
		cmocka_unit_test(test_write_file_errors),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
