/* torch's pickled c10d rendezvous state (see rdzv_state.h). */
#include "rdzv/rdzv_state.h"

#include "base/buf.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MOD_RDZV "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#define MAX_VALUES (1u << 20)
#define MAX_STACK (1u << 16)
#define MAX_INPUT (8u << 20)
#define TD_MAX_DAYS 999999999 /* datetime.timedelta.max.days */

/* ---- time ------------------------------------------------------------- */

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant). */
static long long days_from_civil(long long y, unsigned m, unsigned d)
{
	y -= m <= 2;
	long long era = (y >= 0 ? y : y - 399) / 400;
	unsigned yoe = (unsigned)(y - era * 400);
	unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (long long)doe - 719468;
}

static void civil_from_days(long long z, int *y, unsigned *m, unsigned *d)
{
	z += 719468;
	long long era = (z >= 0 ? z : z - 146096) / 146097;
	unsigned doe = (unsigned)(z - era * 146097);
	unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	unsigned mp = (5 * doy + 2) / 153;
	*d = doy - (153 * mp + 2) / 5 + 1;
	*m = mp < 10 ? mp + 3 : mp - 9;
	*y = (int)(yoe + era * 400 + (*m <= 2));
}

long long rdzv_state_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* datetime's pickled 10 bytes: year (2, big-endian), month, day, hour,
 * minute, second, microsecond (3, big-endian). */
static int dt_from_bytes(const uint8_t *b, long long *us)
{
	unsigned y = (unsigned)b[0] << 8 | b[1], mo = b[2] & 0x7f /* the top bit is fold */, d = b[3], h = b[4], mi = b[5], s = b[6];
	unsigned long usec = (unsigned long)b[7] << 16 | (unsigned long)b[8] << 8 | b[9];
	if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 59 || usec > 999999)
		return -1;
	*us = ((days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s) * 1000000) + (long long)usec;
	return 0;
}

static void dt_to_bytes(long long us, uint8_t *b)
{
	long long secs = us >= 0 ? us / 1000000 : -((-us + 999999) / 1000000);
	long long usec = us - secs * 1000000;
	long long days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
	long long sod = secs - days * 86400;
	int y;
	unsigned m, d;
	civil_from_days(days, &y, &m, &d);
	b[0] = (uint8_t)(y >> 8);
	b[1] = (uint8_t)y;
	b[2] = (uint8_t)m;
	b[3] = (uint8_t)d;
	b[4] = (uint8_t)(sod / 3600);
	b[5] = (uint8_t)(sod / 60 % 60);
	b[6] = (uint8_t)(sod % 60);
	b[7] = (uint8_t)(usec >> 16);
	b[8] = (uint8_t)(usec >> 8);
	b[9] = (uint8_t)usec;
}

/* ---- base64 ------------------------------------------------------------ */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *rdzv_state_b64_encode(const uint8_t *p, size_t n)
{
	char *o = malloc((n + 2) / 3 * 4 + 1), *q = o;
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
		*q++ = B64[v >> 18 & 63];
		*q++ = B64[v >> 12 & 63];
		*q++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
		*q++ = i + 2 < n ? B64[v & 63] : '=';
	}
	*q = '\0';
	return o;
}

int rdzv_state_b64_decode(const char *s, size_t len, uint8_t **out, size_t *n)
{
	uint8_t *o;
	size_t k = 0;
	if (len % 4)
		return -EPROTO;
	if (!(o = malloc(len / 4 * 3 + 1)))
		return -ENOMEM;
	for (size_t i = 0; i < len; i += 4) {
		uint32_t v = 0;
		int pad = 0;
		for (int j = 0; j < 4; j++) {
			const char *c = s[i + j] ? strchr(B64, s[i + j]) : NULL;
			if (s[i + j] == '=' && i + 4 == len && j >= 2 && (j == 3 || s[i + 3] == '=')) {
				pad++;
				v <<= 6;
				continue;
			}
			if (!c || pad) {
				free(o);
				return -EPROTO;
			}
			v = v << 6 | (uint32_t)(c - B64);
		}
		o[k++] = (uint8_t)(v >> 16);
		if (pad < 2)
			o[k++] = (uint8_t)(v >> 8);
		if (pad < 1)
			o[k++] = (uint8_t)v;
	}
	*out = o;
	*n = k;
	return 0;
}

/* ---- nodes -------------------------------------------------------------- */

bool rdzv_state_nd_eq(const struct rdzv_nd *a, const struct rdzv_nd *b)
{
	return a->pid == b->pid && a->local_id == b->local_id && !strcmp(a->addr, b->addr);
}

int rdzv_state_nd_cmp(const struct rdzv_nd *a, const struct rdzv_nd *b)
{
	int c = strcmp(a->addr, b->addr); /* str order is code point order: UTF-8 bytes agree */
	if (c)
		return c;
	if (a->pid != b->pid)
		return a->pid < b->pid ? -1 : 1;
	if (a->local_id != b->local_id)
		return a->local_id < b->local_id ? -1 : 1;
	return 0;
}

int rdzv_state_nd_find(const struct rdzv_nd *list, unsigned n, const struct rdzv_nd *nd)
{
	for (unsigned i = 0; i < n; i++)
		if (rdzv_state_nd_eq(&list[i], nd))
			return (int)i;
	return -1;
}

static uint64_t nd_hash(const struct rdzv_nd *nd)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *p = nd->addr; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	h = (h ^ (uint64_t)nd->pid) * 1099511628211ull;
	h = (h ^ (uint64_t)nd->local_id) * 1099511628211ull;
	return h ^ (h >> 29);
}

int rdzv_nd_index_init(struct rdzv_nd_index *x, size_t maxn)
{
	size_t cap = 16;
	while (cap < 2 * maxn)
		cap *= 2;
	x->cap = cap;
	x->slot = calloc(cap, sizeof(*x->slot));
	return x->slot ? 0 : -ENOMEM;
}

void rdzv_nd_index_free(struct rdzv_nd_index *x)
{
	free(x->slot);
	x->slot = NULL;
	x->cap = 0;
}

long rdzv_nd_index_find(const struct rdzv_nd_index *x, const struct rdzv_nd *nd)
{
	for (size_t i = nd_hash(nd) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
		if (!x->slot[i].nd)
			return -1;
		if (rdzv_state_nd_eq(x->slot[i].nd, nd))
			return x->slot[i].val;
	}
}

void rdzv_nd_index_put(struct rdzv_nd_index *x, const struct rdzv_nd *nd, long val)
{
	size_t i = nd_hash(nd) & (x->cap - 1);
	while (x->slot[i].nd && !rdzv_state_nd_eq(x->slot[i].nd, nd))
		i = (i + 1) & (x->cap - 1);
	x->slot[i].nd = nd;
	x->slot[i].val = val;
}

void rdzv_state_init(struct rdzv_state *s)
{
	s->round = 0;
	s->complete = s->closed = s->has_deadline = false;
	s->deadline_us = 0;
	s->npart = s->nwait = s->nredund = s->nheart = 0;
}

/* ---- decoder: a stack machine over torch's opcodes only ----------------- */

enum pk { PK_MARK, PK_NONE, PK_BOOL, PK_INT, PK_STR, PK_BYTES, PK_TUPLE, PK_DICT, PK_SET, PK_CLASS,
	PK_STATE, PK_NODE, PK_DT, PK_TZ, PK_TD };
enum cls { CLS_STATE, CLS_NODE, CLS_DATETIME, CLS_TIMEZONE, CLS_TIMEDELTA };

struct pval {
	enum pk k;
	long long i;        /* INT, BOOL, CLASS (enum cls), DT (us), TD (us) */
	char *s;            /* STR, BYTES */
	size_t slen;
	unsigned *items;    /* TUPLE, SET: values; DICT: key, value pairs */
	size_t n, cap;
	long long dict;     /* STATE, NODE: the BUILD dict, -1 before */
};

struct dec {
	const uint8_t *p;
	size_t n, at;
	struct pval *v;
	size_t nv, capv;
	unsigned *stack;
	size_t sp;
	unsigned *memo;
	size_t nmemo, capmemo;
	struct dptp_err *err;
	int op_at; /* offset of the current opcode, for messages */
};

__attribute__((format(printf, 2, 3)))
static int bad(struct dec *d, const char *fmt, ...)
{
	char m[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	return dptp_err_set(d->err, -EPROTO, "the rendezvous state is not torch's (byte %d): %s", d->op_at, m);
}

static long long newval(struct dec *d, enum pk k)
{
	if (d->nv == d->capv) {
		size_t c = d->capv ? d->capv * 2 : 64;
		struct pval *nv;
		if (c > MAX_VALUES || !(nv = realloc(d->v, c * sizeof(*nv))))
			return bad(d, "too many objects");
		d->v = nv;
		d->capv = c;
	}
	d->v[d->nv] = (struct pval){.k = k, .dict = -1};
	return (long long)d->nv++;
}

static int push(struct dec *d, long long id)
{
	if (id < 0)
		return (int)id;
	if (d->sp == MAX_STACK)
		return bad(d, "stack too deep");
	d->stack[d->sp++] = (unsigned)id;
	return 0;
}

static int pop(struct dec *d, unsigned *id)
{
	if (d->sp == 0 || d->v[d->stack[d->sp - 1]].k == PK_MARK)
		return bad(d, "stack underflow");
	*id = d->stack[--d->sp];
	return 0;
}

static int additem(struct dec *d, unsigned to, unsigned item)
{
	struct pval *v = &d->v[to];
	if (v->n == v->cap) {
		size_t c = v->cap ? v->cap * 2 : 8;
		unsigned *ni = realloc(v->items, c * sizeof(*ni));
		if (!ni)
			return dptp_err_set(d->err, -ENOMEM, "out of memory");
		v->items = ni;
		v->cap = c;
	}
	v->items[v->n++] = item;
	return 0;
}

static int need(struct dec *d, size_t k)
{
	if (d->n - d->at < k)
		return bad(d, "truncated");
	return 0;
}

static uint64_t le(const uint8_t *p, int k)
{
	uint64_t v = 0;
	for (int i = k - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int take_str(struct dec *d, enum pk k, size_t len)
{
	long long id;
	DPTP_TRY(need(d, len));
	if ((id = newval(d, k)) < 0)
		return (int)id;
	struct pval *v = &d->v[id];
	if (!(v->s = malloc(len + 1)))
		return dptp_err_set(d->err, -ENOMEM, "out of memory");
	memcpy(v->s, d->p + d->at, len);
	v->s[len] = '\0';
	v->slen = len;
	d->at += len;
	if (k == PK_STR && strlen(v->s) != len)
		return bad(d, "a string with a NUL byte");
	/* pickle reads str with errors="surrogatepass": surrogates pass,
	 * anything else that is not UTF-8 stops the load */
	if (k == PK_STR && !dptp_utf8_valid((const uint8_t *)v->s, len, DPTP_UTF8_SURROGATES))
		return bad(d, "a string that is not UTF-8");
	return push(d, id);
}

static int mark_pos(struct dec *d, size_t *pos)
{
	for (size_t i = d->sp; i-- > 0;)
		if (d->v[d->stack[i]].k == PK_MARK) {
			*pos = i;
			return 0;
		}
	return bad(d, "no MARK");
}

static int stack_global(struct dec *d)
{
	static const struct { const char *mod, *name; enum cls c; } ok[] = {
		{MOD_RDZV, "_RendezvousState", CLS_STATE},
		{MOD_RDZV, "_NodeDesc", CLS_NODE},
		{"datetime", "datetime", CLS_DATETIME},
		{"datetime", "timezone", CLS_TIMEZONE},
		{"datetime", "timedelta", CLS_TIMEDELTA},
	};
	unsigned mi = 0, ni = 0; /* set by pop(); GCC 12 -O3 cannot tell */
	DPTP_TRY(pop(d, &ni));
	DPTP_TRY(pop(d, &mi));
	if (d->v[mi].k != PK_STR || d->v[ni].k != PK_STR)
		return bad(d, "STACK_GLOBAL of something that is not two strings");
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcmp(d->v[mi].s, ok[i].mod) && !strcmp(d->v[ni].s, ok[i].name)) {
			long long id = newval(d, PK_CLASS);
			if (id >= 0)
				d->v[id].i = ok[i].c;
			return push(d, id);
		}
	return bad(d, "refusing the global %.60s.%.60s (not part of torch's rendezvous state)", d->v[mi].s, d->v[ni].s);
}

static int reduce(struct dec *d)
{
	unsigned fi = 0, ai = 0;
	DPTP_TRY(pop(d, &ai));
	DPTP_TRY(pop(d, &fi));
	const struct pval *f = &d->v[fi], *a = &d->v[ai];
	if (f->k != PK_CLASS || a->k != PK_TUPLE)
		return bad(d, "REDUCE of something that is not a class and a tuple");
	const unsigned *it = a->items;
	long long id;
	switch ((enum cls)f->i) {
	case CLS_TIMEDELTA: {
		if (a->n != 3 || d->v[it[0]].k != PK_INT || d->v[it[1]].k != PK_INT || d->v[it[2]].k != PK_INT)
			return bad(d, "timedelta arguments are not (days, seconds, microseconds)");
		/* Python normalises (days, seconds, microseconds) and refuses a
		 * result past +-999999999 days (OverflowError); 128 bits hold any
		 * three 64-bit arguments, so nothing wraps on the way. */
		__int128 t = ((__int128)d->v[it[0]].i * 86400 + d->v[it[1]].i) * 1000000 + d->v[it[2]].i;
		const __int128 lim = (__int128)TD_MAX_DAYS * 86400 * 1000000;
		if (t < -lim || t >= lim + (__int128)86400 * 1000000)
			return bad(d, "a timedelta past %d days", TD_MAX_DAYS);
		long long us = (long long)t;
		if ((id = newval(d, PK_TD)) >= 0)
			d->v[id].i = us;
		return push(d, id);
	}
	case CLS_TIMEZONE:
		if (a->n != 1 || d->v[it[0]].k != PK_TD)
			return bad(d, "timezone arguments are not (timedelta,)");
		if (d->v[it[0]].i != 0)
			return bad(d, "a timezone other than UTC (offset %lld us)", d->v[it[0]].i);
		return push(d, newval(d, PK_TZ));
	case CLS_DATETIME: {
		long long us;
		if (a->n == 1)
			return bad(d, "a naive datetime (torch 2.11 writes UTC ones)");
		if (a->n != 2 || d->v[it[0]].k != PK_BYTES || d->v[it[0]].slen != 10 || d->v[it[1]].k != PK_TZ)
			return bad(d, "datetime arguments are not (10 bytes, timezone.utc)");
		if (dt_from_bytes((const uint8_t *)d->v[it[0]].s, &us) < 0)
			return bad(d, "datetime bytes out of range");
		if ((id = newval(d, PK_DT)) >= 0)
			d->v[id].i = us;
		return push(d, id);
	}
	default:
		return bad(d, "REDUCE of a class that torch's state only creates with NEWOBJ");
	}
}

/* ---- one function per kind of opcode ------------------------------------------ */

/* PROTO: protocols 2 to 5. */
static int op_proto(struct dec *d)
{
	DPTP_TRY(need(d, 1));
	if (d->p[d->at] < 2 || d->p[d->at] > 5)
		return bad(d, "pickle protocol %u", d->p[d->at]);
	d->at++;
	return 0;
}

/* FRAME: the framing is only a hint to the reader. */
static int op_frame(struct dec *d)
{
	DPTP_TRY(need(d, 8));
	if (le(d->p + d->at, 8) > d->n - d->at - 8)
		return bad(d, "FRAME longer than the data");
	d->at += 8;
	return 0;
}

/* SHORT_BINUNICODE, BINUNICODE, SHORT_BINBYTES: a length, then the bytes. */
static int op_string(struct dec *d, uint8_t op)
{
	size_t m;
	if (op == 'X') { /* BINUNICODE */
		DPTP_TRY(need(d, 4));
		m = (size_t)le(d->p + d->at, 4);
		d->at += 4;
		return take_str(d, PK_STR, m);
	}
	DPTP_TRY(need(d, 1));
	m = d->p[d->at++];
	return take_str(d, op == 'C' ? PK_BYTES : PK_STR, m);
}

static int op_memoize(struct dec *d)
{
	if (d->sp == 0)
		return bad(d, "MEMOIZE on an empty stack");
	if (d->nmemo == d->capmemo) {
		/* The cap is checked before the memo grows: a grown block is
		 * d->memo at once, so nothing is freed twice. */
		size_t cm = d->capmemo ? d->capmemo * 2 : 64;
		unsigned *nm;
		if (cm > MAX_VALUES)
			return bad(d, "memo too large (more than %u entries)", MAX_VALUES);
		if (!(nm = realloc(d->memo, cm * sizeof(*nm))))
			return dptp_err_set(d->err, -ENOMEM, "out of memory");
		d->memo = nm;
		d->capmemo = cm;
	}
	d->memo[d->nmemo++] = d->stack[d->sp - 1];
	return 0;
}

/* BINGET ('h', a 1-byte index) and LONG_BINGET ('j', 4 bytes). */
static int op_memo_get(struct dec *d, uint8_t op)
{
	DPTP_TRY(need(d, op == 'h' ? 1 : 4));
	size_t m = op == 'h' ? d->p[d->at] : (size_t)le(d->p + d->at, 4);
	d->at += op == 'h' ? 1 : 4;
	if (m >= d->nmemo)
		return bad(d, "memo %zu is not set", m);
	return push(d, d->memo[m]);
}

/* TUPLE1, TUPLE2, TUPLE3: the top one to three values. */
static int op_tuple(struct dec *d, uint8_t op)
{
	unsigned k = op - 0x84u, it[3];
	long long id;
	for (unsigned i = k; i-- > 0;)
		DPTP_TRY(pop(d, &it[i]));
	if ((id = newval(d, PK_TUPLE)) < 0)
		return (int)id;
	for (unsigned i = 0; i < k; i++)
		DPTP_TRY(additem(d, (unsigned)id, it[i]));
	return push(d, id);
}

/* BININT1, BININT2 (unsigned), BININT (signed 32 bits). */
static int op_binint(struct dec *d, uint8_t op)
{
	int k = op == 'K' ? 1 : op == 'M' ? 2 : 4;
	long long id;
	DPTP_TRY(need(d, (size_t)k));
	uint64_t u = le(d->p + d->at, k);
	d->at += (size_t)k;
	if ((id = newval(d, PK_INT)) >= 0)
		d->v[id].i = k == 4 ? (long long)(int32_t)(uint32_t)u : (long long)u;
	return push(d, id);
}

/* LONG1: little-endian two's complement, at most 8 bytes here. */
static int op_long1(struct dec *d)
{
	size_t m;
	long long id;
	DPTP_TRY(need(d, 1));
	m = d->p[d->at++];
	DPTP_TRY(need(d, m));
	if (m > 8)
		return bad(d, "an integer of %zu bytes", m);
	uint64_t u = m ? le(d->p + d->at, (int)m) : 0;
	if (m && m < 8 && (d->p[d->at + m - 1] & 0x80))
		u |= ~(uint64_t)0 << (8 * m);
	d->at += m;
	if ((id = newval(d, PK_INT)) >= 0)
		d->v[id].i = (long long)u;
	return push(d, id);
}

static int op_setitem(struct dec *d)
{
	unsigned a = 0, b = 0, c = 0;
	DPTP_TRY(pop(d, &c));
	DPTP_TRY(pop(d, &b));
	DPTP_TRY(pop(d, &a));
	if (d->v[a].k != PK_DICT)
		return bad(d, "SETITEM on something that is not a dict");
	DPTP_TRY(additem(d, a, b));
	DPTP_TRY(additem(d, a, c));
	return push(d, a);
}

/* SETITEMS ('u', into a dict) and ADDITEMS (into a set): the values above
 * the MARK. */
static int op_items(struct dec *d, uint8_t op)
{
	size_t m = 0;
	DPTP_TRY(mark_pos(d, &m));
	if (m == 0)
		return bad(d, "nothing under the MARK");
	unsigned a = d->stack[m - 1];
	if (d->v[a].k != (op == 'u' ? PK_DICT : PK_SET))
		return bad(d, "%s on the wrong kind of object", op == 'u' ? "SETITEMS" : "ADDITEMS");
	if (op == 'u' && (d->sp - m - 1) % 2)
		return bad(d, "SETITEMS with an odd number of items");
	for (size_t i = m + 1; i < d->sp; i++)
		DPTP_TRY(additem(d, a, d->stack[i]));
	d->sp = m;
	return 0;
}

static int op_newobj(struct dec *d)
{
	unsigned a = 0, b = 0;
	DPTP_TRY(pop(d, &b));
	DPTP_TRY(pop(d, &a));
	if (d->v[a].k != PK_CLASS || d->v[b].k != PK_TUPLE || d->v[b].n != 0 ||
	    (d->v[a].i != CLS_STATE && d->v[a].i != CLS_NODE))
		return bad(d, "NEWOBJ other than _RendezvousState() or _NodeDesc()");
	return push(d, newval(d, d->v[a].i == CLS_STATE ? PK_STATE : PK_NODE));
}

static int op_build(struct dec *d)
{
	unsigned a = 0, b = 0;
	DPTP_TRY(pop(d, &b));
	DPTP_TRY(pop(d, &a));
	if ((d->v[a].k != PK_STATE && d->v[a].k != PK_NODE) || d->v[b].k != PK_DICT || d->v[a].dict >= 0)
		return bad(d, "BUILD other than a state or node from a dict");
	d->v[a].dict = b;
	return push(d, a);
}

/* Runs one opcode; *stop at STOP. */
static int run_op(struct dec *d, uint8_t op, bool *stop)
{
	long long id;
	switch (op) {
	case 0x80: /* PROTO */
		return op_proto(d);
	case 0x95: /* FRAME */
		return op_frame(d);
	case 0x8c: /* SHORT_BINUNICODE */
	case 'X': /* BINUNICODE */
	case 'C': /* SHORT_BINBYTES */
		return op_string(d, op);
	case 0x94: /* MEMOIZE */
		return op_memoize(d);
	case 'h': /* BINGET */
	case 'j': /* LONG_BINGET */
		return op_memo_get(d, op);
	case 0x93: /* STACK_GLOBAL */
		return stack_global(d);
	case ')': /* EMPTY_TUPLE */
		return push(d, newval(d, PK_TUPLE));
	case 0x85: /* TUPLE1 */
	case 0x86: /* TUPLE2 */
	case 0x87: /* TUPLE3 */
		return op_tuple(d, op);
	case '}': /* EMPTY_DICT */
		return push(d, newval(d, PK_DICT));
	case 0x8f: /* EMPTY_SET */
		return push(d, newval(d, PK_SET));
	case '(': /* MARK */
		return push(d, newval(d, PK_MARK));
	case 'N':
		return push(d, newval(d, PK_NONE));
	case 0x88: /* NEWTRUE */
	case 0x89: /* NEWFALSE */
		if ((id = newval(d, PK_BOOL)) >= 0)
			d->v[id].i = op == 0x88;
		return push(d, id);
	case 'K': /* BININT1 */
	case 'M': /* BININT2 */
	case 'J': /* BININT */
		return op_binint(d, op);
	case 0x8a: /* LONG1 */
		return op_long1(d);
	case 's': /* SETITEM */
		return op_setitem(d);
	case 'u': /* SETITEMS */
	case 0x90: /* ADDITEMS */
		return op_items(d, op);
	case 0x81: /* NEWOBJ */
		return op_newobj(d);
	case 'b': /* BUILD */
		return op_build(d);
	case 'R':
		return reduce(d);
	case '.':
		*stop = true;
		return 0;
	default:
		return bad(d, "opcode 0x%02x is not one torch's rendezvous state uses", op);
	}
}

/* The value of attribute name in a built object's dict, or -1. A name set
 * twice keeps its last value, as a Python dict does. */
static long long attr(const struct dec *d, const struct pval *obj, const char *name)
{
	const struct pval *dict = &d->v[obj->dict];
	for (size_t i = dict->n & ~(size_t)1; i >= 2; i -= 2)
		if (d->v[dict->items[i - 2]].k == PK_STR && !strcmp(d->v[dict->items[i - 2]].s, name))
			return dict->items[i - 1];
	return -1;
}

static int check_attrs(struct dec *d, const struct pval *obj, const char *const *names, size_t n, const char *what)
{
	const struct pval *dict = &d->v[obj->dict];
	for (size_t i = 0; i + 1 < dict->n; i += 2) {
		const struct pval *k = &d->v[dict->items[i]];
		size_t j = 0;
		if (k->k != PK_STR)
			return bad(d, "%s has an attribute name that is not a string", what);
		while (j < n && strcmp(k->s, names[j]))
			j++;
		if (j == n)
			return bad(d, "%s has an unknown attribute '%.60s'", what, k->s);
	}
	for (size_t j = 0; j < n; j++)
		if (attr(d, obj, names[j]) < 0)
			return bad(d, "%s lacks the attribute '%s'", what, names[j]);
	return 0;
}

static int node_of(struct dec *d, unsigned id, struct rdzv_nd *nd)
{
	static const char *const names[] = {"addr", "pid", "local_id"};
	const struct pval *o = &d->v[id];
	if (o->k != PK_NODE || o->dict < 0)
		return bad(d, "a node that is not a built _NodeDesc");
	DPTP_TRY(check_attrs(d, o, names, 3, "_NodeDesc"));
	const struct pval *a = &d->v[attr(d, o, "addr")], *p = &d->v[attr(d, o, "pid")],
		*l = &d->v[attr(d, o, "local_id")];
	if (a->k != PK_STR || p->k != PK_INT || l->k != PK_INT)
		return bad(d, "_NodeDesc fields are not (str, int, int)");
	if (a->slen >= RDZV_ADDR_MAX)
		return bad(d, "_NodeDesc addr of %zu bytes", a->slen);
	memcpy(nd->addr, a->s, a->slen + 1);
	nd->pid = p->i;
	nd->local_id = l->i;
	return 0;
}

/* Node id into list[0..*n) as a Python dict (val: its value, of kind vk)
 * or set (vals NULL) takes it: a node equal to one already there is the
 * same key, so a set keeps the first and a dict the first key with the
 * last value. */
static int put_node(struct dec *d, unsigned id, unsigned val, enum pk vk, struct rdzv_nd *list, long long *vals,
		    unsigned *n, struct rdzv_nd_index *ix, const char *what)
{
	struct rdzv_nd nd;
	DPTP_TRY(node_of(d, id, &nd));
	if (vals && d->v[val].k != vk)
		return bad(d, "%s is not %s", what, vk == PK_INT ? "an int" : "a datetime");
	long at = rdzv_nd_index_find(ix, &nd);
	if (at < 0) {
		if (*n == RDZV_MAX_NODES)
			return dptp_err_set(d->err, -E2BIG, "the rendezvous state has more than %d nodes", RDZV_MAX_NODES);
		at = (long)(*n)++;
		list[at] = nd;
		rdzv_nd_index_put(ix, &list[at], at);
	}
	if (vals)
		vals[at] = d->v[val].i;
	return 0;
}

static int to_state(struct dec *d, unsigned top, struct rdzv_state *s)
{
	static const char *const names[] = {"round", "complete", "deadline", "closed", "participants", "wait_list",
		"redundancy_list", "last_heartbeats"};
	const struct pval *o = &d->v[top];
	if (o->k != PK_STATE || o->dict < 0)
		return bad(d, "the pickle is not a _RendezvousState");
	DPTP_TRY(check_attrs(d, o, names, 8, "_RendezvousState"));
	const struct pval *r = &d->v[attr(d, o, "round")], *cp = &d->v[attr(d, o, "complete")],
		*dl = &d->v[attr(d, o, "deadline")], *cl = &d->v[attr(d, o, "closed")],
		*pa = &d->v[attr(d, o, "participants")], *wl = &d->v[attr(d, o, "wait_list")],
		*rl = &d->v[attr(d, o, "redundancy_list")], *hb = &d->v[attr(d, o, "last_heartbeats")];
	if (r->k != PK_INT || cp->k != PK_BOOL || cl->k != PK_BOOL || (dl->k != PK_NONE && dl->k != PK_DT) ||
	    pa->k != PK_DICT || wl->k != PK_SET || rl->k != PK_SET || hb->k != PK_DICT)
		return bad(d, "_RendezvousState attributes of the wrong types");
	rdzv_state_init(s);
	s->round = r->i;
	s->complete = cp->i;
	s->closed = cl->i;
	s->has_deadline = dl->k == PK_DT;
	s->deadline_us = s->has_deadline ? dl->i : 0;
	/* Entries written twice are bounded before they are folded: torch
	 * never writes a node twice. */
	if (pa->n / 2 > 4 * RDZV_MAX_NODES || wl->n > 4 * RDZV_MAX_NODES || rl->n > 4 * RDZV_MAX_NODES ||
	    hb->n / 2 > 4 * RDZV_MAX_NODES)
		return dptp_err_set(d->err, -E2BIG, "the rendezvous state has more than %d nodes", RDZV_MAX_NODES);
	struct rdzv_nd_index ix[4] = {{0}};
	int rc = 0;
	size_t ns[4] = {pa->n / 2, wl->n, rl->n, hb->n / 2};
	for (int k = 0; k < 4 && rc == 0; k++)
		if (rdzv_nd_index_init(&ix[k], ns[k]) < 0)
			rc = dptp_err_set(d->err, -ENOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && i < pa->n; i += 2)
		rc = put_node(d, pa->items[i], pa->items[i + 1], PK_INT, s->part, s->rank, &s->npart, &ix[0],
			"a participant's rank");
	for (size_t i = 0; rc == 0 && i < wl->n; i++)
		rc = put_node(d, wl->items[i], 0, PK_NONE, s->wait, NULL, &s->nwait, &ix[1], NULL);
	for (size_t i = 0; rc == 0 && i < rl->n; i++)
		rc = put_node(d, rl->items[i], 0, PK_NONE, s->redund, NULL, &s->nredund, &ix[2], NULL);
	for (size_t i = 0; rc == 0 && i < hb->n; i += 2)
		rc = put_node(d, hb->items[i], hb->items[i + 1], PK_DT, s->heart, s->heart_us, &s->nheart, &ix[3],
			"a heartbeat");
	for (int k = 0; k < 4; k++)
		rdzv_nd_index_free(&ix[k]);
	return rc;
}

int rdzv_state_decode(const uint8_t *p, size_t n, struct rdzv_state *s, struct dptp_err *err)
{
	struct dec d = {.p = p, .n = n, .err = err};
	bool stop = false;
	int rc = 0;
	if (n > MAX_INPUT)
		return dptp_err_set(err, -E2BIG, "the rendezvous state is %zu bytes (at most %u)", n, MAX_INPUT);
	if (!(d.stack = malloc(MAX_STACK * sizeof(*d.stack))))
		return dptp_err_set(err, -ENOMEM, "out of memory");
	while (!stop && rc == 0) {
		d.op_at = (int)d.at;
		if (d.at >= n) {
			rc = bad(&d, "no STOP");
			break;
		}
		rc = run_op(&d, p[d.at++], &stop);
	}
	if (rc == 0 && d.at != n)
		rc = bad(&d, "%zu bytes after STOP", n - d.at);
	if (rc == 0 && d.sp != 1)
		rc = bad(&d, "%zu objects left on the stack", d.sp);
	if (rc == 0)
		rc = to_state(&d, d.stack[0], s);
	for (size_t i = 0; i < d.nv; i++) {
		free(d.v[i].s);
		free(d.v[i].items);
	}
	free(d.v);
	free(d.stack);
	free(d.memo);
	return rc;
}

/* ---- encoder: what pickle.dumps(state, protocol 4) writes ---------------- */

enum { M_MOD_RDZV, M_MOD_DT, M_CLS_STATE, M_CLS_NODE, M_CLS_DT, M_CLS_TZ, M_CLS_TD, M_UTC,
	M_ADDR, M_PID, M_LOCAL_ID, M_NFIXED };

struct enc {
	struct dptp_buf b;     /* the pickle */
	long memo[M_NFIXED];   /* -1 until written */
	long next;             /* next memo index */
	struct rdzv_nd_index nodes; /* nodes written so far -> their memo */
};

static void put(struct enc *e, const void *p, size_t n)
{
	dptp_buf_add(&e->b, p, n);
}

static void put1(struct enc *e, uint8_t c)
{
	put(e, &c, 1);
}

static long memoize(struct enc *e)
{
	put1(e, 0x94);
	return e->next++;
}

static void get(struct enc *e, long m)
{
	if (m < 256) {
		uint8_t b[2] = {'h', (uint8_t)m};
		put(e, b, 2);
	} else {
		uint8_t b[5] = {'j', (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24)};
		put(e, b, 5);
	}
}

static long str(struct enc *e, const char *s)
{
	size_t n = strlen(s);
	if (n <= 0xff) {
		put1(e, 0x8c);
		put1(e, (uint8_t)n);
	} else {
		uint8_t h[5] = {'X', (uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
		put(e, h, 5);
	}
	put(e, s, n);
	return memoize(e);
}

/* A string memoised once (interned names, module names). */
static void str_once(struct enc *e, int slot, const char *s)
{
	if (e->memo[slot] >= 0)
		get(e, e->memo[slot]);
	else
		e->memo[slot] = str(e, s);
}

static void integer(struct enc *e, long long v)
{
	if (v >= 0 && v <= 0xff) {
		uint8_t b[2] = {'K', (uint8_t)v};
		put(e, b, 2);
	} else if (v >= 0 && v <= 0xffff) {
		uint8_t b[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
		put(e, b, 3);
	} else if (v >= -0x80000000LL && v <= 0x7fffffffLL) {
		uint32_t u = (uint32_t)(int32_t)v;
		uint8_t b[5] = {'J', (uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
		put(e, b, 5);
	} else { /* LONG1: shortest two's complement, as pickle.encode_long */
		uint8_t b[10];
		unsigned n = 8;
		uint64_t u = (uint64_t)v;
		while (n > 1) {
			uint8_t top = (uint8_t)(u >> (8 * (n - 1))), next = (uint8_t)(u >> (8 * (n - 2)));
			if ((top == 0 && !(next & 0x80)) || (top == 0xff && (next & 0x80)))
				n--;
			else
				break;
		}
		b[0] = 0x8a;
		b[1] = (uint8_t)n;
		for (unsigned i = 0; i < n; i++)
			b[2 + i] = (uint8_t)(u >> (8 * i));
		put(e, b, 2 + n);
	}
}

static void global(struct enc *e, int slot, int mod_slot, const char *mod, const char *name)
{
	if (e->memo[slot] >= 0) {
		get(e, e->memo[slot]);
		return;
	}
	str_once(e, mod_slot, mod);
	str(e, name);
	put1(e, 0x93);
	e->memo[slot] = memoize(e);
}

static void utc(struct enc *e)
{
	if (e->memo[M_UTC] >= 0) {
		get(e, e->memo[M_UTC]);
		return;
	}
	global(e, M_CLS_TZ, M_MOD_DT, "datetime", "timezone");
	global(e, M_CLS_TD, M_MOD_DT, "datetime", "timedelta");
	put(e, "K\0K\0K\0\x87", 7); /* (0, 0, 0) */
	memoize(e);
	put1(e, 'R');
	memoize(e);
	put1(e, 0x85);
	memoize(e);
	put1(e, 'R');
	e->memo[M_UTC] = memoize(e);
}

static void datetime(struct enc *e, long long us)
{
	uint8_t b[12] = {'C', 10};
	global(e, M_CLS_DT, M_MOD_DT, "datetime", "datetime");
	dt_to_bytes(us, b + 2);
	put(e, b, 12);
	memoize(e);
	utc(e);
	put1(e, 0x86);
	memoize(e);
	put1(e, 'R');
	memoize(e);
}

static void node(struct enc *e, const struct rdzv_nd *nd)
{
	long m = rdzv_nd_index_find(&e->nodes, nd);
	if (m >= 0) {
		get(e, m);
		return;
	}
	global(e, M_CLS_NODE, M_MOD_RDZV, MOD_RDZV, "_NodeDesc");
	put1(e, ')');
	put1(e, 0x81);
	rdzv_nd_index_put(&e->nodes, nd, memoize(e));
	put1(e, '}');
	memoize(e);
	put1(e, '(');
	str_once(e, M_ADDR, "addr");
	str(e, nd->addr);
	str_once(e, M_PID, "pid");
	integer(e, nd->pid);
	str_once(e, M_LOCAL_ID, "local_id");
	integer(e, nd->local_id);
	put1(e, 'u');
	put1(e, 'b');
}

/* A dict of n items: SETITEM for one, MARK..SETITEMS for more (batches of
 * 1000, as the pickler). */
static void dict_items(struct enc *e, unsigned n, const struct rdzv_nd *keys, const long long *vals, bool dt)
{
	put1(e, '}');
	memoize(e);
	for (unsigned i = 0; i < n; i += 1000) {
		unsigned end = n - i > 1000 ? i + 1000 : n;
		if (end - i > 1)
			put1(e, '(');
		for (unsigned k = i; k < end; k++) {
			node(e, &keys[k]);
			if (dt)
				datetime(e, vals[k]);
			else
				integer(e, vals[k]);
		}
		put1(e, end - i > 1 ? 'u' : 's');
	}
}

static void set_items(struct enc *e, unsigned n, const struct rdzv_nd *items)
{
	put1(e, 0x8f);
	memoize(e);
	for (unsigned i = 0; i < n; i += 1000) {
		unsigned end = n - i > 1000 ? i + 1000 : n;
		put1(e, '(');
		for (unsigned k = i; k < end; k++)
			node(e, &items[k]);
		put1(e, 0x90);
	}
}

int rdzv_state_encode(const struct rdzv_state *s, uint8_t **out, size_t *n, struct dptp_err *err)
{
	struct enc e = {.next = 0};
	size_t maxn = (size_t)s->npart + s->nwait + s->nredund + s->nheart;
	for (int i = 0; i < M_NFIXED; i++)
		e.memo[i] = -1;
	if (rdzv_nd_index_init(&e.nodes, maxn) < 0) {
		e.b.oom = true;
		goto done;
	}
	put(&e, "\x80\x04\x95\0\0\0\0\0\0\0\0", 11); /* PROTO 4, FRAME (length below) */
	global(&e, M_CLS_STATE, M_MOD_RDZV, MOD_RDZV, "_RendezvousState");
	put1(&e, ')');
	put1(&e, 0x81);
	memoize(&e);
	put1(&e, '}');
	memoize(&e);
	put1(&e, '(');
	str(&e, "round");
	integer(&e, s->round);
	str(&e, "complete");
	put1(&e, s->complete ? 0x88 : 0x89);
	str(&e, "deadline");
	if (s->has_deadline)
		datetime(&e, s->deadline_us);
	else
		put1(&e, 'N');
	str(&e, "closed");
	put1(&e, s->closed ? 0x88 : 0x89);
	str(&e, "participants");
	dict_items(&e, s->npart, s->part, s->rank, false);
	str(&e, "wait_list");
	set_items(&e, s->nwait, s->wait);
	str(&e, "redundancy_list");
	set_items(&e, s->nredund, s->redund);
	str(&e, "last_heartbeats");
	dict_items(&e, s->nheart, s->heart, s->heart_us, true);
	put1(&e, 'u');
	put1(&e, 'b');
	put1(&e, '.');
done:
	rdzv_nd_index_free(&e.nodes);
	if (e.b.oom) {
		dptp_buf_release(&e.b);
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	uint64_t fl = e.b.len - 11;
	for (int i = 0; i < 8; i++)
		e.b.buf[3 + i] = (uint8_t)(fl >> (8 * i));
	*out = e.b.buf;
	*n = e.b.len;
	return 0;
}
