/* The audit's record format (dptp-run --audit), defined once here for its
 * three users: the Python recorder (launcher/audit/dptp_audit_rec.py), the
 * LD_PRELOAD recorder (launcher/audit/preload.c) and the analysis
 * (launcher/audit.c).
 *
 * Files: one per recorder and worker, under the job's audit folder
 * ($DPTP_AUDIT_DIR), named r<RANK>.a<RESTART>.<py|c>.jsonl. Each record is
 * one JSON object on one line, written with one write(2) on an O_APPEND
 * descriptor: a record is in the file as soon as the call it describes
 * starts, so the files survive a crash or a SIGKILL. Values are strings,
 * integers (64-bit), floats, true/false/null and arrays of integers; objects
 * do not nest. Keys, by kind ("k"):
 *
 *   hello  rank world local_rank pid host att(restart count) rec("py"|"c")
 *          [torch (version)]                 first record of every file
 *   group  g(global ranks, group-rank order) gn site [backend]
 *   op     op g gn seq [src dst gsrc gdst (as passed)] n(elements, -1
 *          unknown) [dt dev] site t          a torch.distributed call, at entry
 *   dev    dev how site                      a device selection
 *   sock   call(bind|connect|listen) fam(unix|inet|inet6) addr [port] rc err
 *   shm    call(shm_open|shm_unlink|open) name fl(open flags) rc err
 *   nccl   call(init|op) id [nranks crank dev op n root] rc
 *   exit   t                                 the interpreter's orderly exit
 *
 * g + gn name a group across ranks: its member list and, among the groups
 * with that member list, the order this rank created it in (0 first).
 * seq counts the calls on that group, from 1. site is "file:line" of the
 * caller outside torch. */
#ifndef DPTP_LIB_AUDIT_REC_H
#define DPTP_LIB_AUDIT_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DPTP_AUDIT_DIR_ENV "DPTP_AUDIT_DIR"
/* the launcher's pid: only its direct children (the workers) record */
#define DPTP_AUDIT_PPID_ENV "DPTP_AUDIT_PPID"
#define DPTP_AUDIT_FILE_FMT "r%d.a%d.%s.jsonl"

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

#endif
