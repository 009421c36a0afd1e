/* The audit's record format (dptp-run --audit), defined once here for its
 * three users: the Python recorder (launcher/audit/dptp_audit_rec.py), the
 * LD_PRELOAD recorder (launcher/audit/preload.c) and the analysis
 * (launcher/audit/). The contract between them: /work/contract.md of the
 * session that made it, kept here.
 *
 * Files: one per recorder and recording process, under the job's audit
 * folder ($DPTP_AUDIT_DIR), named a<RESTART>.p<PID>.<py|c>.jsonl (every
 * process with DPTP_AUDIT_DIR records: the workers and every process they
 * start; an exec in the same pid appends to the same file, after a second
 * hello); the launcher's own launcher.jsonl (wstart, wexit, hang). Each
 * record is one JSON object on one line, written with one write(2) on an
 * O_APPEND descriptor held high (>= 1000) and checked before each write: a
 * record is in the file as soon as the call it describes starts, so the
 * files survive a crash or a SIGKILL. Values are strings, integers (64-bit),
 * floats, true/false/null and arrays of integers; objects do not nest.
 * Readers ignore keys they do not know. Keys, by kind ("k"):
 *
 *   hello  rank world local_rank (from the environment as inherited, -1
 *          absent) pid ppid worker(getppid() == DPTP_AUDIT_PPID) host
 *          att(restart count) rec("py"|"c") [torch (version)] [flags pre]
 *          (py) [py exe img] (c: a Python interpreter?, /proc/self/exe, 0
 *          for the pid's first image, 1 after its first exec, ...)
 *                                            first record of every image
 *   world  id("HOST:PORT"|"file:PATH"|...) size rank backend timeout
 *   group  g(global ranks, group-rank order) gn site [backend]
 *   op     op g gn seq [src dst gsrc gdst (as passed)] n(elements, -1
 *          unknown) [dt dev fc] site t       a torch.distributed call, at entry
 *   done   g gn seq [err]                    its return
 *   site   call key site outer               the Python frame of the C
 *                                            record that follows (call+key)
 *   dev    dev how site                      a device selection
 *   sock   call(bind|connect|listen) fam(unix|inet|inet6) addr [port] rc err
 *          [site] [by("nccl")]
 *   shm    call(shm_open|shm_unlink|open) name fl(open flags) rc err [site]
 *   nccl   call(init|op) id [nranks crank dev op n root] rc
 *   gpu    call(ipc_get|ipc_open|vmm_export|vmm_import) api(runtime|driver)
 *          ht(ipc|fd|fabric|other) h [ino xpid] dev rc [site] [by("nccl")]
 *          h: 16 hex digits, equal on the exporter and the importer of the
 *          same memory: FNV-1a 64 (basis 0xcbf29ce484222325) of the 64
 *          handle bytes (ipc, fabric), or of the descriptor's st_dev,
 *          st_ino and exporter pid, 8 bytes each in host order (fd: every
 *          export is a /dev/nvidiactl descriptor; the exporter marks it with
 *          F_SETOWN, so h names the exporting process, not the allocation);
 *          ino: that st_ino; xpid: that exporter pid
 *   cap    max                               the per-process record cap
 *                                            (DPTP_AUDIT_MAX_RECORDS) reached
 *   count  g gn seq nc hs (py) | id seq nc hs (c: an NCCL communicator)
 *                                            at the end, after the cap: per
 *          group (communicator) the calls (seq), the collectives (nc) and
 *          hs, 16 hex digits: the sum mod 2^64 of dptp_audit_term() over
 *          the collectives not written as op (nccl) records (below)
 *   end    how(exit|_exit|atexit) code(null: unknown) records lost dropped
 *          (records: written by this image before it, its hello included;
 *          lost: not written: write errors, short writes, over the cap;
 *          dropped: those of lost over the cap)
 *   exit   t                                 the old end (readers accept it)
 *
 * g + gn name a group across ranks: its member list and, among the groups
 * with that member list, the order this rank created it in (0 first).
 * seq counts the calls on that group, from 1. site is "file:line" of the
 * caller outside torch, or in C records "lib.so+0xOFF" of the calling code
 * (dladdr). All t are CLOCK_MONOTONIC seconds. */
#ifndef DPTP_LIB_AUDIT_REC_H
#define DPTP_LIB_AUDIT_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DPTP_AUDIT_DIR_ENV "DPTP_AUDIT_DIR"
/* the launcher's pid: a process whose parent it is, is a worker */
#define DPTP_AUDIT_PPID_ENV "DPTP_AUDIT_PPID"
/* the C recorder's image count, <pid>:<image> (the one variable it sets) */
#define DPTP_AUDIT_IMG_ENV "DPTP_AUDIT_IMG"
/* the per-process record cap */
#define DPTP_AUDIT_MAX_ENV "DPTP_AUDIT_MAX_RECORDS"
#define DPTP_AUDIT_MAX_DEFAULT 200000
/* a<att>.p<pid>.<py|c>.jsonl */
#define DPTP_AUDIT_FILE_FMT "a%d.p%d.%s.jsonl"

#define DPTP_AUDIT_MAX_FIELDS 24

enum dptp_audit_val { DPTP_AV_NULL, DPTP_AV_INT, DPTP_AV_NUM, DPTP_AV_STR, DPTP_AV_ARR, DPTP_AV_BOOL };

struct dptp_audit_field {
	const char *key; /* into the record's own copy of the line */
	enum dptp_audit_val type;
	int64_t i;       /* INT, BOOL */
	double d;        /* NUM (and INT) */
	const char *s;   /* STR, unescaped */
	const int64_t *a; /* ARR */
	size_t n;        /* ARR length, STR length */
};

struct dptp_audit_rec {
	char *buf;       /* owned: the unescaped strings */
	int64_t *arr;    /* owned: the arrays' elements */
	size_t nfields;
	struct dptp_audit_field f[DPTP_AUDIT_MAX_FIELDS];
};

/* Parses one line (len bytes, no newline needed) into *r. Returns 0, or
 * -EINVAL for a line that is not a flat object of the types above (a torn
 * last line of a killed worker), -ENOMEM. Release with
 * dptp_audit_rec_release() in both cases. */
int dptp_audit_rec_parse(const char *line, size_t len, struct dptp_audit_rec *r);
void dptp_audit_rec_release(struct dptp_audit_rec *r);

const struct dptp_audit_field *dptp_audit_rec_get(const struct dptp_audit_rec *r, const char *key);
/* The string, or dflt when absent or not a string. */
const char *dptp_audit_rec_str(const struct dptp_audit_rec *r, const char *key, const char *dflt);
/* The integer, or dflt when absent, null or not an integer. */
int64_t dptp_audit_rec_int(const struct dptp_audit_rec *r, const char *key, int64_t dflt);
bool dptp_audit_rec_has(const struct dptp_audit_rec *r, const char *key);

/* Calls past the cap are compared by a sum of terms (/work/contract.md,
 * 08:25 UTC). A collective's signature is what its record would carry:
 * "op|n|dt|roots" for an op record (n -1 and dt "" when it has none; roots
 * "src=1", in the order src, dst, gsrc, gdst, joined by ","), and
 * "op|n|nccl<dt>|root=R" for an nccl op record (root=R when it has a root).
 * Point-to-point calls (send, recv, isend, irecv, send/recv_object_list)
 * have no term. */

/* FNV-1a 64 of a signature's n bytes */
static inline uint64_t dptp_audit_sig_hash(const char *sig, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)sig[i]) * 0x100000001b3ULL;
	return h;
}

/* The term of the collective with signature hash sig_h at place pos (from
 * 0) among its process's collectives on its group: splitmix64's finalizer
 * of sig_h + pos * 0x9E3779B97F4A7C15 (mod 2^64). */
static inline uint64_t dptp_audit_term(uint64_t sig_h, uint64_t pos)
{
	uint64_t z = sig_h + pos * 0x9E3779B97F4A7C15ULL;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

#endif
