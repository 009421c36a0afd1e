/* PyTorch 2.11 TCPStore wire protocol: a client, a server and the pure frame
 * scanner they share (reference/TORCHRUN.md section D).
 *
 * Wire format: one opcode byte, then fields; integers little-endian; a
 * string/bytes field is a u64 length followed by the raw bytes. Requests are
 * answered strictly in order; there are no request ids.
 *
 * Keys: like torch's TCPStore, the client puts a prefix in front of every key
 * it is given. The default prefix is "/" (set("k") sends "/k"). A
 * PrefixStore(p, store) is dptp_tcpstore_client_push_prefix(c, p): the prefix
 * becomes old + p + "/", so pushing "default_pg", "0/", "cuda/" turns key "0"
 * into "/default_pg/0//cuda//0", as torch does. set_prefix(c, "") gives raw
 * keys ("init/" is raw).
 *
 * Errors: negative errno, with a message in *err (err may be NULL).
 * -ETIMEDOUT: a call ran past its timeout; -ECONNRESET/-EPIPE: the peer went
 * away; -EPROTO: the peer sent something the protocol does not allow;
 * -EMSGSIZE: a key, value or count over the limits. After any error other
 * than a wait timeout or an empty queue the client connection is marked
 * broken and every later call returns -ENOTCONN. lib/ never prints. */
#ifndef DPTP_LIB_TCPSTORE_H
#define DPTP_LIB_TCPSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/util.h"

#define DPTP_TCPSTORE_MAGIC 0x3C85F7CEu
#define DPTP_TCPSTORE_MAX_KEY (8u * 1024u)              /* bytes per key */
#define DPTP_TCPSTORE_MAX_VALUE (8u * 1024u * 1024u)    /* bytes per value */
#define DPTP_TCPSTORE_MAX_KEYS (128u * 1024u)           /* keys per request */
#define DPTP_TCPSTORE_DEFAULT_CLIENT_BYTES (64u * 1024u * 1024u)
#define DPTP_TCPSTORE_DEFAULT_TOTAL_BYTES (512u * 1024u * 1024u)
#define DPTP_TCPSTORE_DEFAULT_TIMEOUT 300.0             /* seconds, as Python */

enum dptp_tcpstore_op {
	DPTP_TCPSTORE_VALIDATE = 0,
	DPTP_TCPSTORE_SET = 1,
	DPTP_TCPSTORE_COMPARE_SET = 2,
	DPTP_TCPSTORE_GET = 3,
	DPTP_TCPSTORE_ADD = 4,
	DPTP_TCPSTORE_CHECK = 5,
	DPTP_TCPSTORE_WAIT = 6,
	DPTP_TCPSTORE_GETNUMKEYS = 7,
	DPTP_TCPSTORE_DELETE_KEY = 8,
	DPTP_TCPSTORE_APPEND = 9,
	DPTP_TCPSTORE_MULTI_GET = 10,
	DPTP_TCPSTORE_MULTI_SET = 11,
	DPTP_TCPSTORE_CANCEL_WAIT = 12,
	DPTP_TCPSTORE_PING = 13,
	DPTP_TCPSTORE_QUEUE_PUSH = 14,
	DPTP_TCPSTORE_QUEUE_POP = 15,
	DPTP_TCPSTORE_QUEUE_LEN = 16,
	DPTP_TCPSTORE_LIST_KEYS = 17,
	DPTP_TCPSTORE_NOPS
};

/* ---- torch before 2.1 ------------------------------------------------------
 * Clients of torch 1.13 to 2.0 (and 2.1's nightlies before pytorch PR 107607)
 * send no VALIDATE and number their queries from SET = 0. Their frames have
 * the same fields as the current ones; WATCH_KEY (a string) exists only here,
 * on the second, callback connection each of their TCPStores opens. The
 * server tells a connection's dialect from its first bytes: a 0 followed by
 * the magic is a VALIDATE (a legacy SET would announce a key of over a
 * gigabyte there); anything else is a legacy query. */
enum dptp_tcpstore_legacy_op {
	DPTP_TCPSTORE_LEGACY_SET = 0,
	DPTP_TCPSTORE_LEGACY_COMPARE_SET = 1,
	DPTP_TCPSTORE_LEGACY_GET = 2,
	DPTP_TCPSTORE_LEGACY_ADD = 3,
	DPTP_TCPSTORE_LEGACY_CHECK = 4,
	DPTP_TCPSTORE_LEGACY_WAIT = 5,
	DPTP_TCPSTORE_LEGACY_GETNUMKEYS = 6,
	DPTP_TCPSTORE_LEGACY_WATCH_KEY = 7,
	DPTP_TCPSTORE_LEGACY_DELETE_KEY = 8,
	DPTP_TCPSTORE_LEGACY_APPEND = 9,      /* 2.1 nightlies: APPEND .. CANCEL_WAIT */
	DPTP_TCPSTORE_LEGACY_MULTI_GET = 10,
	DPTP_TCPSTORE_LEGACY_MULTI_SET = 11,
	DPTP_TCPSTORE_LEGACY_CANCEL_WAIT = 12,
	DPTP_TCPSTORE_LEGACY_NOPS
};

/* WATCH_KEY in the current numbering's space (no current client sends it). */
#define DPTP_TCPSTORE_WATCH_KEY DPTP_TCPSTORE_NOPS

/* Messages on a legacy callback connection: u8 type, then (but for
 * CALLBACK_REGISTERED) the key, the old value and the new value as strings. */
enum dptp_tcpstore_watch_event {
	DPTP_TCPSTORE_KEY_UPDATED = 0,
	DPTP_TCPSTORE_KEY_CREATED = 1,
	DPTP_TCPSTORE_KEY_DELETED = 2,
	DPTP_TCPSTORE_KEY_CALLBACK_REGISTERED = 3,
	DPTP_TCPSTORE_KEY_APPENDED = 4,
};

enum dptp_tcpstore_dialect {
	DPTP_TCPSTORE_DIALECT_UNKNOWN = 0,
	DPTP_TCPSTORE_DIALECT_LEGACY,   /* torch 1.13 - 2.0 */
	DPTP_TCPSTORE_DIALECT_CURRENT,  /* torch 2.1 and later */
};

/* A legacy opcode in the current numbering (DPTP_TCPSTORE_WATCH_KEY for
 * WATCH_KEY), or -1 when there is none. */
int dptp_tcpstore_op_from_legacy(int op);
/* A current opcode in the legacy numbering, or -1 when the old servers have
 * no such query (VALIDATE, PING, the queues, LIST_KEYS). */
int dptp_tcpstore_op_to_legacy(int op);
/* The dialect of a connection whose first len bytes are buf: UNKNOWN while
 * a 0 is followed by fewer than 4 bytes that still match the magic. */
enum dptp_tcpstore_dialect dptp_tcpstore_dialect_of(const void *buf, size_t len);

/* ---- integers and request frames (pure: no I/O) -----------------------------
 * Every integer on the wire is a little-endian u64 (lengths, counts, ADD
 * deltas); a string is its u64 length and its bytes. */

static inline void dptp_le64_put(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t dptp_le64_get(const uint8_t *b)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | b[i];
	return v;
}

/* Request frames appended to a struct dptp_buf (base/buf.h), for any code
 * that does its own I/O (the client below, dptp-run's non-blocking
 * cross-node links). */
void dptp_tcpstore_frame_u8(struct dptp_buf *f, uint8_t v);
void dptp_tcpstore_frame_u32(struct dptp_buf *f, uint32_t v);
void dptp_tcpstore_frame_u64(struct dptp_buf *f, uint64_t v);
/* u64 length, then the bytes (p may be NULL when n is 0). */
void dptp_tcpstore_frame_str(struct dptp_buf *f, const void *p, size_t n);
/* VALIDATE with the magic, then PING with the nonce the server echoes. */
void dptp_tcpstore_frame_handshake(struct dptp_buf *f, uint32_t nonce);
/* Whole SET and single-key WAIT requests. */
void dptp_tcpstore_frame_set(struct dptp_buf *f, const char *key, const void *v, size_t n);
void dptp_tcpstore_frame_wait(struct dptp_buf *f, const char *key);

/* Reply bytes of CHECK and WAIT / CANCEL_WAIT. */
#define DPTP_TCPSTORE_READY 0
#define DPTP_TCPSTORE_NOT_READY 1
#define DPTP_TCPSTORE_STOP_WAITING 0
#define DPTP_TCPSTORE_WAIT_CANCELED 1

/* Limits a scanner enforces; zero fields take the DPTP_TCPSTORE_MAX_* value. */
struct dptp_tcpstore_limits {
	uint64_t max_key;
	uint64_t max_value;
	uint64_t max_keys;
};

/* Name of an opcode ("SET"), or NULL when out of range. */
const char *dptp_tcpstore_op_name(int op);

/* ---- frame scanner (pure: no allocation, no state, no I/O) ---------------
 * Looks at the request that starts at buf[0] (len bytes available).
 * Returns 1 when a complete frame is there (*out = its length in bytes),
 * 0 when more bytes are needed (*out = the smallest total length known to be
 * needed so far, always > len), or a negative errno: -EPROTO for an unknown
 * opcode or a VALIDATE with the wrong magic, -EMSGSIZE for a key, value or
 * key count over the limits (checked on the length prefix itself, before
 * any of the bytes it announces). lim may be NULL (defaults). */
int dptp_tcpstore_scan_request(const void *buf, size_t len,
			       const struct dptp_tcpstore_limits *lim, size_t *out);
/* The same for a legacy frame (legacy opcode at buf[0]). */
int dptp_tcpstore_scan_legacy_request(const void *buf, size_t len,
				      const struct dptp_tcpstore_limits *lim, size_t *out);

/* ---- byte buffers --------------------------------------------------------- */

/* A value. data is malloc'd, NUL-terminated one past len (for convenience);
 * the owner frees it with free(data) or dptp_tcpstore_bufs_free(). */
struct dptp_tcpstore_buf {
	uint8_t *data;
	size_t len;
};

/* Frees every bufs[i].data and then bufs itself; NULL is fine. */
void dptp_tcpstore_bufs_free(struct dptp_tcpstore_buf *bufs, size_t n);
/* Frees keys[i] and keys; NULL is fine. */
void dptp_tcpstore_keys_free(char **keys, size_t n);

/* ---- client ---------------------------------------------------------------- */

/* One TCP connection. Not thread-safe: one call at a time (torch serialises
 * its calls with a lock too). */
struct dptp_tcpstore_client;

struct dptp_tcpstore_client_opts {
	const char *host;       /* name or address; borrowed for create() only */
	uint16_t port;
	double timeout;         /* seconds; bounds connect (with retries) and
				 * every later call; <= 0 means 300 s */
	bool add_init;          /* send ADD "init/" 1 after the handshake, as a
				 * torch TCPStore created with a world_size */
	uint32_t ping_nonce;    /* PING nonce; 0 = getpid() with bit 23 set
				 * (see create()) */
	const int *abort_fd;    /* NULL, or an fd (a signalfd): once it is
				 * readable, connecting and every call end with
				 * -EINTR (the connection is then broken) */
	double retry_max;       /* the longest wait between connect attempts
				 * (seconds); <= 0 means 1 s */
};

/* Connects (retrying with exponential backoff and jitter until the timeout),
 * sends VALIDATE+PING in one write, checks the echo, then the optional
 * ADD "init/". A server that closes the connection on the VALIDATE is
 * taken for torch before 2.1: the client connects again and speaks that
 * protocol from then on (after a GETNUMKEYS it must answer); there the
 * queues, PING and LIST_KEYS fail with -ENOTSUP, and a WAIT that times out
 * ends with a new connection instead of CANCEL_WAIT. *out is owned by the
 * caller: dptp_tcpstore_client_destroy(). */
int dptp_tcpstore_client_create(const struct dptp_tcpstore_client_opts *opts,
				struct dptp_tcpstore_client **out, struct dptp_err *err);
/* A second client on c's connection (no new connection, no handshake):
 * its own prefix ("/", as create()'s), timeout and request buffer; c's
 * abort fd. Calls on the two must not overlap (each call is one request and
 * its whole reply, so one thread calling both is fine). The connection
 * closes with the last of them. 0 or -ENOMEM. */
int dptp_tcpstore_client_share(struct dptp_tcpstore_client *c, struct dptp_tcpstore_client **out,
			       struct dptp_err *err);
/* Frees; closes the connection unless a client shared it (see above) and
 * is not yet destroyed. NULL is fine. */
void dptp_tcpstore_client_destroy(struct dptp_tcpstore_client *c);

/* Whether the server turned out to be torch before 2.1 (see create()). */
bool dptp_tcpstore_client_legacy(const struct dptp_tcpstore_client *c);
/* Value of "init/" returned by the ADD at connect (0 when add_init is off). */
int64_t dptp_tcpstore_client_init_count(const struct dptp_tcpstore_client *c);
/* Changes the per-call timeout (seconds, > 0). */
void dptp_tcpstore_client_set_timeout(struct dptp_tcpstore_client *c, double timeout);

/* Key prefix (see the top of this file). set_prefix copies a literal prefix
 * ("" = raw keys, "/" = the default). push_prefix appends p + "/", like
 * wrapping the store in PrefixStore(p). get_prefix's string is borrowed and
 * valid until the next prefix change. Return 0 or -ENOMEM / -EMSGSIZE. */
int dptp_tcpstore_client_set_prefix(struct dptp_tcpstore_client *c, const char *prefix);
int dptp_tcpstore_client_push_prefix(struct dptp_tcpstore_client *c, const char *p);
const char *dptp_tcpstore_client_get_prefix(const struct dptp_tcpstore_client *c);

/* Every call below maps keys through the prefix, takes keys as NUL-terminated
 * strings and values as (pointer, length), borrows its inputs, and is bounded
 * by the client's timeout. */

/* SET key = val. */
int dptp_tcpstore_client_set(struct dptp_tcpstore_client *c, const char *key,
			     const void *val, size_t len, struct dptp_err *err);
/* WAIT [key] then GET key: blocks until the key exists. *out is the
 * caller's (free(out->data)). */
int dptp_tcpstore_client_get(struct dptp_tcpstore_client *c, const char *key,
			     struct dptp_tcpstore_buf *out, struct dptp_err *err);
/* ADD key delta; *result (may be NULL) gets the new value. */
int dptp_tcpstore_client_add(struct dptp_tcpstore_client *c, const char *key,
			     int64_t delta, int64_t *result, struct dptp_err *err);
/* CHECK: *ready = every key exists (a non-empty queue counts). */
/* ADD deltas[i] to keys[i] for every i, pipelined: one send, n replies
 * (results may be NULL). A missing key counts from 0, as ADD does. */
int dptp_tcpstore_client_add_many(struct dptp_tcpstore_client *c, const char *const *keys,
				  const int64_t *deltas, size_t n, int64_t *results, struct dptp_err *err);
int dptp_tcpstore_client_check(struct dptp_tcpstore_client *c, const char *const *keys,
			       size_t n, bool *ready, struct dptp_err *err);
/* WAIT until every key exists, at most timeout seconds (<= 0: the client's
 * timeout). On timeout sends CANCEL_WAIT, drains the replies and returns
 * -ETIMEDOUT ("wait timeout after Nms, keys: ..."); the connection stays
 * usable. Returns 0 when the keys arrived, even during the cancel. */
int dptp_tcpstore_client_wait(struct dptp_tcpstore_client *c, const char *const *keys,
			      size_t n, double timeout, struct dptp_err *err);
/* COMPARE_SET: replaces the value by desired when it equals expected (a
 * missing key matches an empty expected). *current (may be NULL) gets the
 * value after the op, as the server reports it; caller frees. */
int dptp_tcpstore_client_compare_set(struct dptp_tcpstore_client *c, const char *key,
				     const void *expected, size_t elen,
				     const void *desired, size_t dlen,
				     struct dptp_tcpstore_buf *current, struct dptp_err *err);
/* DELETE_KEY; *deleted (may be NULL) says whether it existed. */
int dptp_tcpstore_client_delete_key(struct dptp_tcpstore_client *c, const char *key,
				    bool *deleted, struct dptp_err *err);
/* APPEND val to key (created when missing). */
int dptp_tcpstore_client_append(struct dptp_tcpstore_client *c, const char *key,
				const void *val, size_t len, struct dptp_err *err);
/* WAIT on all keys then MULTI_GET. *vals is a new array of n buffers owned by
 * the caller: dptp_tcpstore_bufs_free(*vals, n). */
int dptp_tcpstore_client_multi_get(struct dptp_tcpstore_client *c, const char *const *keys,
				   size_t n, struct dptp_tcpstore_buf **vals,
				   struct dptp_err *err);
/* MULTI_SET keys[i] = vals[i]. */
int dptp_tcpstore_client_multi_set(struct dptp_tcpstore_client *c, const char *const *keys,
				   const struct dptp_tcpstore_buf *vals, size_t n,
				   struct dptp_err *err);
/* GETNUMKEYS: every key in the store, whatever its prefix (init/ included). */
int dptp_tcpstore_client_num_keys(struct dptp_tcpstore_client *c, int64_t *n,
				  struct dptp_err *err);
/* QUEUE_PUSH val onto the queue named key. */
int dptp_tcpstore_client_queue_push(struct dptp_tcpstore_client *c, const char *key,
				    const void *val, size_t len, struct dptp_err *err);
/* QUEUE_POP (after WAIT [key] when block). Returns -EAGAIN ("queue is empty")
 * when the queue is empty; *out is the caller's. */
int dptp_tcpstore_client_queue_pop(struct dptp_tcpstore_client *c, const char *key,
				   bool block, struct dptp_tcpstore_buf *out,
				   struct dptp_err *err);
/* QUEUE_LEN. */
int dptp_tcpstore_client_queue_len(struct dptp_tcpstore_client *c, const char *key,
				   int64_t *n, struct dptp_err *err);
/* LIST_KEYS: the keys under the current prefix, with the prefix removed
 * (keys outside it, such as init/, are left out, as torch does). *keys is a
 * new array of *n strings owned by the caller: dptp_tcpstore_keys_free(). */
int dptp_tcpstore_client_list_keys(struct dptp_tcpstore_client *c, char ***keys,
				   size_t *n, struct dptp_err *err);

/* ---- server ---------------------------------------------------------------- */

/* The store (one flat namespace: keys are stored exactly as sent, queues
 * live beside the keys) and its listening socket and clients. Driven either
 * by _step() from one thread, or by its own thread after _start(). A new
 * WAIT from a client replaces its unanswered one; a disconnect drops it.
 * Every write (SET, ADD, APPEND, COMPARE_SET, MULTI_SET) answers each waiter
 * whose keys now all exist; QUEUE_PUSH answers the oldest such waiter on that
 * queue only, so that one blocked queue_pop takes one item. Waiters are
 * indexed by their first missing key: a write costs the waiters of the key
 * it wrote, not every waiter's key list. Each connection is served in its
 * own dialect, told by its first bytes (see "torch before 2.1" above): torch
 * 2.1+ clients and torch 1.13 - 2.0 ones share one port and one namespace,
 * and a legacy WATCH_KEY connection is told of every later change of its
 * key (CREATED, UPDATED, DELETED, APPENDED), whoever made it. A connection is
 * closed on a protocol error (see the scanners), a second VALIDATE, an ADD
 * on a value that is not a number, or when its buffered input, output,
 * pending wait and watches pass max_client_bytes. */
struct dptp_tcpstore_server;

struct dptp_tcpstore_server_opts {
	const char *host;        /* address to bind exactly ("127.0.0.1", "::",
				  * a name: its first address that binds);
				  * "::" is dual-stack; NULL = "::", falling back
				  * to 0.0.0.0 as torch does. Borrowed. */
	uint16_t port;           /* 0 = ephemeral; see _port() */
	int backlog;             /* <= 0: 16384 (capped by the kernel) */
	size_t max_client_bytes; /* input + output buffered per client before it
				  * is disconnected; 0 = 64 MiB */
	struct dptp_tcpstore_limits limits; /* zero fields = defaults */
	/* memory budget over what the server holds for its clients: each
	 * connection, its buffers, every stored key, value and queue item,
	 * counted at their heap cost (allocation overhead, struct, hash slot).
	 * Each is charged to the peer that made it: this host's own user, a
	 * local uid other than ours (found with sock_diag), or a remote
	 * address (IPv6 by /64); a peer's connections share its charge. A
	 * peer other than this host's user gets at most an eighth of the
	 * budget, and all of them together half, so the job's own processes
	 * keep the rest; their connections cost at least budget /
	 * RLIMIT_NOFILE each, so that they hold at most half the descriptors. Past a limit a connection, a growing input, a reply,
	 * a WAIT or a write is refused and its connection closed, others go
	 * on. 0 = the environment's DPTP_STORE_MAX_BYTES, else 512 MiB */
	size_t max_total_bytes;
	/* called from the server's thread at a refusal (once per peer, at
	 * most 8 times; NULL: none); msg is one line without a newline */
	void (*log)(void *arg, const char *msg);
	void *log_arg;
};

/* Binds and listens. The server serves nobody until stepped or started.
 * *out is the caller's: dptp_tcpstore_server_destroy(). */
int dptp_tcpstore_server_create(const struct dptp_tcpstore_server_opts *opts,
				struct dptp_tcpstore_server **out, struct dptp_err *err);
/* Stops the thread when running, closes every socket, frees; NULL is fine. */
void dptp_tcpstore_server_destroy(struct dptp_tcpstore_server *s);
/* The bound port (the ephemeral one when asked for 0). */
uint16_t dptp_tcpstore_server_port(const struct dptp_tcpstore_server *s);
/* One round of the event loop: waits up to timeout_ms (-1 = forever) for
 * activity, then accepts, reads, answers and writes what it can. Returns 0,
 * or a negative errno on a fatal loop error. Not while the thread runs. */
int dptp_tcpstore_server_step(struct dptp_tcpstore_server *s, int timeout_ms,
			      struct dptp_err *err);
/* Runs the loop in a new thread until dptp_tcpstore_server_stop(). */
int dptp_tcpstore_server_start(struct dptp_tcpstore_server *s, struct dptp_err *err);
/* Wakes and joins the thread; the store and clients stay as they are. */
void dptp_tcpstore_server_stop(struct dptp_tcpstore_server *s);
/* Counters, safe to read from any thread. */
size_t dptp_tcpstore_server_nclients(const struct dptp_tcpstore_server *s);
size_t dptp_tcpstore_server_buffered(const struct dptp_tcpstore_server *s);
size_t dptp_tcpstore_server_nkeys(const struct dptp_tcpstore_server *s);
/* Connections closed for a protocol error or a limit since creation. */
size_t dptp_tcpstore_server_nrejected(const struct dptp_tcpstore_server *s);
/* Bytes counted against the budget (max_total_bytes) now. */
size_t dptp_tcpstore_server_used(const struct dptp_tcpstore_server *s);
/* The server's counters as one line ("port=.. steps=.. accepted=..
 * peak_conns=.. cas_missed=.. fd_pauses=.. get=N get_in=B get_out=B ..."):
 * operations, request and reply bytes per opcode; fd_pauses: the times it
 * held its accepts back to keep descriptors for the rest of the process.
 * Call it on a stopped server (or from the thread that steps it). */
void dptp_tcpstore_server_stats(const struct dptp_tcpstore_server *s, char *line, size_t len);

#endif
