/* TCPStore wire protocol: opcode names and the pure request frame scanner. */
#include "wire/tcpstore.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[DPTP_TCPSTORE_NOPS] = {
	[DPTP_TCPSTORE_VALIDATE] = "VALIDATE",
	[DPTP_TCPSTORE_SET] = "SET",
	[DPTP_TCPSTORE_COMPARE_SET] = "COMPARE_SET",
	[DPTP_TCPSTORE_GET] = "GET",
	[DPTP_TCPSTORE_ADD] = "ADD",
	[DPTP_TCPSTORE_CHECK] = "CHECK",
	[DPTP_TCPSTORE_WAIT] = "WAIT",
	[DPTP_TCPSTORE_GETNUMKEYS] = "GETNUMKEYS",
	[DPTP_TCPSTORE_DELETE_KEY] = "DELETE_KEY",
	[DPTP_TCPSTORE_APPEND] = "APPEND",
	[DPTP_TCPSTORE_MULTI_GET] = "MULTI_GET",
	[DPTP_TCPSTORE_MULTI_SET] = "MULTI_SET",
	[DPTP_TCPSTORE_CANCEL_WAIT] = "CANCEL_WAIT",
	[DPTP_TCPSTORE_PING] = "PING",
	[DPTP_TCPSTORE_QUEUE_PUSH] = "QUEUE_PUSH",
	[DPTP_TCPSTORE_QUEUE_POP] = "QUEUE_POP",
	[DPTP_TCPSTORE_QUEUE_LEN] = "QUEUE_LEN",
	[DPTP_TCPSTORE_LIST_KEYS] = "LIST_KEYS",
};

const char *dptp_tcpstore_op_name(int op)
{
	if (op < 0 || op >= DPTP_TCPSTORE_NOPS)
		return NULL;
	return op_names[op];
}

/* Legacy opcode -> current one. Up to GETNUMKEYS the legacy number is the
 * current one minus one (VALIDATE came in front); from DELETE_KEY on they
 * agree (WATCH_KEY went away where VALIDATE came in). */
static const int8_t from_legacy[DPTP_TCPSTORE_LEGACY_NOPS] = {
	[DPTP_TCPSTORE_LEGACY_SET] = DPTP_TCPSTORE_SET,
	[DPTP_TCPSTORE_LEGACY_COMPARE_SET] = DPTP_TCPSTORE_COMPARE_SET,
	[DPTP_TCPSTORE_LEGACY_GET] = DPTP_TCPSTORE_GET,
	[DPTP_TCPSTORE_LEGACY_ADD] = DPTP_TCPSTORE_ADD,
	[DPTP_TCPSTORE_LEGACY_CHECK] = DPTP_TCPSTORE_CHECK,
	[DPTP_TCPSTORE_LEGACY_WAIT] = DPTP_TCPSTORE_WAIT,
	[DPTP_TCPSTORE_LEGACY_GETNUMKEYS] = DPTP_TCPSTORE_GETNUMKEYS,
	[DPTP_TCPSTORE_LEGACY_WATCH_KEY] = DPTP_TCPSTORE_WATCH_KEY,
	[DPTP_TCPSTORE_LEGACY_DELETE_KEY] = DPTP_TCPSTORE_DELETE_KEY,
	[DPTP_TCPSTORE_LEGACY_APPEND] = DPTP_TCPSTORE_APPEND,
	[DPTP_TCPSTORE_LEGACY_MULTI_GET] = DPTP_TCPSTORE_MULTI_GET,
	[DPTP_TCPSTORE_LEGACY_MULTI_SET] = DPTP_TCPSTORE_MULTI_SET,
	[DPTP_TCPSTORE_LEGACY_CANCEL_WAIT] = DPTP_TCPSTORE_CANCEL_WAIT,
};

int dptp_tcpstore_op_from_legacy(int op)
{
	if (op < 0 || op >= DPTP_TCPSTORE_LEGACY_NOPS)
		return -1;
	return from_legacy[op];
}

int dptp_tcpstore_op_to_legacy(int op)
{
	for (int i = 0; i < DPTP_TCPSTORE_LEGACY_NOPS; i++)
		if (from_legacy[i] == op)
			return i;
	return -1;
}

enum dptp_tcpstore_dialect dptp_tcpstore_dialect_of(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint8_t magic[4];
	for (int i = 0; i < 4; i++)
		magic[i] = (uint8_t)(DPTP_TCPSTORE_MAGIC >> (8 * i));
	if (len == 0)
		return DPTP_TCPSTORE_DIALECT_UNKNOWN;
	if (p[0] != DPTP_TCPSTORE_VALIDATE)
		return DPTP_TCPSTORE_DIALECT_LEGACY;
	size_t have = len - 1 < 4 ? len - 1 : 4;
	if (memcmp(p + 1, magic, have) != 0)
		return DPTP_TCPSTORE_DIALECT_LEGACY; /* a SET, or garbage the scanner refuses */
	return have == 4 ? DPTP_TCPSTORE_DIALECT_CURRENT : DPTP_TCPSTORE_DIALECT_UNKNOWN;
}

void dptp_tcpstore_bufs_free(struct dptp_tcpstore_buf *bufs, size_t n)
{
	if (!bufs)
		return;
	for (size_t i = 0; i < n; i++)
		free(bufs[i].data);
	free(bufs);
}

void dptp_tcpstore_keys_free(char **keys, size_t n)
{
	if (!keys)
		return;
	for (size_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
}

/* Scanner state: a read-only cursor. A field that does not fit yet stops the
 * scan with "need more" and the total length known to be needed. */
struct scan {
	const uint8_t *p;
	size_t len;
	size_t off;
	size_t need;  /* set when a field ran past len */
	struct dptp_tcpstore_limits lim;
};

enum { S_OK = 0, S_MORE = 1 };

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int take(struct scan *s, uint64_t n)
{
	if (n > s->len - s->off) {
		/* n is bounded by the limits (<= 8 MiB) or by 8, so no overflow */
		s->need = s->off + (size_t)n;
		return S_MORE;
	}
	s->off += (size_t)n;
	return S_OK;
}

static int take_u64(struct scan *s, uint64_t *v)
{
	size_t at = s->off;
	int rc = take(s, 8);
	if (rc == S_OK)
		*v = dptp_le64_get(s->p + at);
	return rc;
}

/* A length-prefixed field whose length may be at most max. */
static int take_str(struct scan *s, uint64_t max)
{
	uint64_t n = 0;
	int rc = take_u64(s, &n);
	if (rc != S_OK)
		return rc;
	if (n > max)
		return -EMSGSIZE;
	return take(s, n);
}

static int take_count(struct scan *s, uint64_t *n)
{
	int rc = take_u64(s, n);
	if (rc != S_OK)
		return rc;
	if (*n > s->lim.max_keys)
		return -EMSGSIZE;
	return S_OK;
}

#define STEP(expr) do { int step_rc_ = (expr); if (step_rc_ != S_OK) return step_rc_; } while (0)

static int scan_body(struct scan *s, uint8_t op)
{
	uint64_t n = 0;
	switch (op) {
	case DPTP_TCPSTORE_VALIDATE: {
		size_t at = s->off;
		STEP(take(s, 4));
		if (le32(s->p + at) != DPTP_TCPSTORE_MAGIC)
			return -EPROTO;
		return S_OK;
	}
	case DPTP_TCPSTORE_PING:
		return take(s, 4);
	case DPTP_TCPSTORE_SET:
	case DPTP_TCPSTORE_APPEND:
	case DPTP_TCPSTORE_QUEUE_PUSH:
		STEP(take_str(s, s->lim.max_key));
		return take_str(s, s->lim.max_value);
	case DPTP_TCPSTORE_COMPARE_SET:
		STEP(take_str(s, s->lim.max_key));
		STEP(take_str(s, s->lim.max_value));
		return take_str(s, s->lim.max_value);
	case DPTP_TCPSTORE_GET:
	case DPTP_TCPSTORE_DELETE_KEY:
	case DPTP_TCPSTORE_WATCH_KEY:
	case DPTP_TCPSTORE_QUEUE_POP:
	case DPTP_TCPSTORE_QUEUE_LEN:
		return take_str(s, s->lim.max_key);
	case DPTP_TCPSTORE_ADD:
		STEP(take_str(s, s->lim.max_key));
		return take(s, 8);
	case DPTP_TCPSTORE_CHECK:
	case DPTP_TCPSTORE_WAIT:
	case DPTP_TCPSTORE_MULTI_GET:
		STEP(take_count(s, &n));
		for (uint64_t i = 0; i < n; i++)
			STEP(take_str(s, s->lim.max_key));
		return S_OK;
	case DPTP_TCPSTORE_MULTI_SET:
		STEP(take_count(s, &n));
		for (uint64_t i = 0; i < n; i++) {
			STEP(take_str(s, s->lim.max_key));
			STEP(take_str(s, s->lim.max_value));
		}
		return S_OK;
	case DPTP_TCPSTORE_GETNUMKEYS:
	case DPTP_TCPSTORE_CANCEL_WAIT:
	case DPTP_TCPSTORE_LIST_KEYS:
		return S_OK;
	default:
		return -EPROTO;
	}
}

/* op: the frame's opcode in the current numbering (-1: none). */
static int scan_frame(const void *buf, size_t len, const struct dptp_tcpstore_limits *lim,
		      int op, size_t *out)
{
	struct scan s = {.p = buf, .len = len};
	s.lim.max_key = lim && lim->max_key ? lim->max_key : DPTP_TCPSTORE_MAX_KEY;
	s.lim.max_value = lim && lim->max_value ? lim->max_value : DPTP_TCPSTORE_MAX_VALUE;
	s.lim.max_keys = lim && lim->max_keys ? lim->max_keys : DPTP_TCPSTORE_MAX_KEYS;
	if (s.lim.max_key > DPTP_TCPSTORE_MAX_VALUE)
		s.lim.max_key = DPTP_TCPSTORE_MAX_VALUE;
	if (s.lim.max_value > (uint64_t)1 << 40)
		s.lim.max_value = (uint64_t)1 << 40;
	if (len == 0) {
		*out = 1;
		return 0;
	}
	if (op < 0)
		return -EPROTO;
	s.off = 1;
	int rc = scan_body(&s, (uint8_t)op);
	if (rc < 0)
		return rc;
	if (rc == S_MORE) {
		*out = s.need;
		return 0;
	}
	*out = s.off;
	return 1;
}

int dptp_tcpstore_scan_request(const void *buf, size_t len,
			       const struct dptp_tcpstore_limits *lim, size_t *out)
{
	const uint8_t *p = buf;
	int op = len ? p[0] : 0;
	return scan_frame(buf, len, lim, op == DPTP_TCPSTORE_WATCH_KEY ? -1 : op, out);
}

int dptp_tcpstore_scan_legacy_request(const void *buf, size_t len,
				      const struct dptp_tcpstore_limits *lim, size_t *out)
{
	const uint8_t *p = buf;
	return scan_frame(buf, len, lim, len ? dptp_tcpstore_op_from_legacy(p[0]) : 0, out);
}
