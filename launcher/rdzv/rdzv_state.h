/* The c10d rendezvous state of torch 2.11 (dynamic_rendezvous.py), as it
 * lives in the store: base64(pickle.dumps(_RendezvousState)) under
 * "/torch.rendezvous.<run_id>", protocol 4.
 *
 * Decoding reads only the opcodes and classes torch's state is made of
 * (_RendezvousState, _NodeDesc, datetime with timezone.utc, timedelta, str,
 * int, bool, None, dict, set, bytes, tuples) with a small stack machine; it
 * never imports or calls anything, and anything else (another global, a
 * list, a naive or non-UTC datetime, an unknown attribute) is refused with a
 * message that names it. Encoding writes the bytes Python's pickler writes
 * for the same objects: one frame, the interned attribute names, classes and
 * timezone.utc memoised once, a node that appears in several containers
 * written once (torch's flows share the object). Times are microseconds
 * since the epoch, UTC. */
#ifndef DPTP_LAUNCHER_RDZV_STATE_H
#define DPTP_LAUNCHER_RDZV_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define RDZV_MAX_NODES 8192
#define RDZV_ADDR_MAX 256

struct rdzv_nd {
	char addr[RDZV_ADDR_MAX];
	long long pid, local_id;
};

struct rdzv_state {
	long long round;
	bool complete, closed, has_deadline;
	long long deadline_us;
	unsigned npart, nwait, nredund, nheart;
	struct rdzv_nd part[RDZV_MAX_NODES];
	long long rank[RDZV_MAX_NODES];
	struct rdzv_nd wait[RDZV_MAX_NODES];
	struct rdzv_nd redund[RDZV_MAX_NODES];
	struct rdzv_nd heart[RDZV_MAX_NODES];
	long long heart_us[RDZV_MAX_NODES];
};

/* The value torch's backend puts under the key before any state exists
 * (base64 of "canimadam"). */
#define RDZV_NULL_SENTINEL "Y2FuaW1hZGFt"

/* A fresh state: round 0, nothing in it (torch's _RendezvousState()). */
void rdzv_state_init(struct rdzv_state *s);

/* Pickle bytes to *s. -EPROTO (with the reason) for anything that is not
 * torch's state, -E2BIG past RDZV_MAX_NODES. */
int rdzv_state_decode(const uint8_t *p, size_t n, struct rdzv_state *s, struct dptp_err *err);
/* *s to pickle bytes (malloc'd, the caller frees). */
int rdzv_state_encode(const struct rdzv_state *s, uint8_t **out, size_t *n, struct dptp_err *err);

/* base64 (RFC 4648, padded) of n bytes; malloc'd and NUL-terminated. */
char *rdzv_state_b64_encode(const uint8_t *p, size_t n);
/* base64 text to bytes (malloc'd); -EPROTO on a character or length that is
 * not base64. */
int rdzv_state_b64_decode(const char *s, size_t len, uint8_t **out, size_t *n);

/* Node lists. */
bool rdzv_state_nd_eq(const struct rdzv_nd *a, const struct rdzv_nd *b);
/* Python's ordering of _NodeDesc (order=True): addr, then pid, local_id. */
int rdzv_state_nd_cmp(const struct rdzv_nd *a, const struct rdzv_nd *b);
/* Index of nd in list[0..n), or -1. */
int rdzv_state_nd_find(const struct rdzv_nd *list, unsigned n, const struct rdzv_nd *nd);

/* An index of nodes (equal as rdzv_state_nd_eq), for lookups in O(1):
 * open addressing over pointers to nodes that outlive it, each with a
 * value. init sizes it for maxn nodes (-ENOMEM); put adds or replaces. */
struct rdzv_nd_index {
	struct { const struct rdzv_nd *nd; long val; } *slot;
	size_t cap;
};
int rdzv_nd_index_init(struct rdzv_nd_index *x, size_t maxn);
void rdzv_nd_index_free(struct rdzv_nd_index *x);
long rdzv_nd_index_find(const struct rdzv_nd_index *x, const struct rdzv_nd *nd);
void rdzv_nd_index_put(struct rdzv_nd_index *x, const struct rdzv_nd *nd, long val);

/* Wall clock now, microseconds since the epoch (datetime.now(timezone.utc)). */
long long rdzv_state_now_us(void);

#endif
