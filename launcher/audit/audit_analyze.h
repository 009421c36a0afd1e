/* dptp-run --audit: the analysis of what the recorders wrote (the record
 * format is lib/base/audit_rec.h, the files and records are listed in the
 * audit contract). Reads the audit folder of one job: one file per
 * recording process and recorder (a<att>.p<pid>.<py|c>.jsonl) and the
 * launcher's own (launcher.jsonl: worker starts and exits). Processes are
 * keyed by pid; a process's world and rank come from its `world` record
 * (init_process_group), else from NCCL / its environment (a worker).
 * Every attempt is analysed, world by world: the DP x PP x TP layout is
 * inferred from the groups the program created (or taken as given), and
 * the family's mechanisms (reference/FAMILY.md) are found per DP replica:
 *   P  members of one group disagree on its collective sequence; a rank
 *      that exited (any way) or is behind before a collective its peers
 *      entered
 *   R  a src/dst outside the call's group; the same numeric peer on every
 *      replica
 *   I  one socket or shared-memory name bound or created by several ranks
 *      (a collision the rank recovers from, the free-port loop, is none)
 *   C  one port bound by ranks of different replicas
 *   G  a broadcast loop over a group spanning replicas whose sources are not
 *      one per replica; a per-replica socket, segment or GPU memory used
 *      across replicas
 *   D  two ranks of one host on one device; a device not LOCAL_RANK's
 * What was not recorded is a gap: the verdict is then incomplete, never a
 * pass. */
#ifndef DPTP_LAUNCHER_AUDIT_ANALYZE_H
#define DPTP_LAUNCHER_AUDIT_ANALYZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/layout.h"
#include "base/util.h"

/* one collective a rank entered, for the side-by-side view of a hang */
struct audit_call {
	long long seq;      /* the call's number on its group, from 1 */
	char op[32];
	char group[64];     /* "0,2" (global ranks) */
	char site[160];     /* "file:line" or "" */
	bool open;          /* entered and not left (no `done`) */
};

/* the last collectives of one rank, oldest first */
struct audit_trail {
	int rank;
	pid_t pid;
	struct audit_call *c; /* owned */
	size_t n;
};

struct audit_finding {
	char mech;          /* 'P', 'R', 'I', 'C', 'G', 'D' */
	int *ranks;         /* owned, sorted */
	size_t nranks;
	int *replicas;      /* owned, sorted; none when the layout is unknown */
	size_t nreplicas;
	char *site;         /* owned, "file:line" (or "lib.so+0xOFF" of the C recorder) or "" */
	char op[48];
	int *group;         /* owned: the call's group, global ranks; may be empty */
	size_t ngroup;
	char *detail;       /* owned: the evidence, one sentence */
	char world_id[128]; /* the world it was found in (audit_result.world_id) */
	int attempt;
	struct audit_trail *trail; /* owned: a hang's last collectives of each rank of the group; may be empty */
	size_t ntrail;
};

/* why a rank or process was not fully recorded */
struct audit_gap {
	int rank;           /* the world rank, -1 unknown */
	pid_t pid;          /* 0 unknown */
	int attempt;
	char why[256];      /* "the Python recorder did not load (python -I)", "records truncated (a torn last line)", ... */
};

/* a worker's exit as the launcher saw it (launcher.jsonl wexit) */
struct audit_exit {
	int rank;
	pid_t pid;
	int attempt;
	int code;           /* exit status, -1 when killed by a signal */
	int sig;            /* the signal that ended it, 0 none */
	bool core;          /* dumped core */
	double t;           /* CLOCK_MONOTONIC seconds */
};

/* one world of one attempt */
struct audit_result {
	char world_id[128]; /* "127.0.0.1:29500", "file:/tmp/x", or "" for the launcher's world
	                       (ranks known only from the environment / NCCL) */
	int world;          /* its size; 0: nothing was recorded */
	int attempt;        /* the restart count analysed */
	bool layout_known;
	struct dptp_layout layout;
	char layout_how[256]; /* "given", "inferred from ...", or why not */
	size_t nrecorded;   /* ranks with records */
	size_t nrecords;
	struct audit_gap *gaps; /* non-empty: the verdict is incomplete unless a finding fails */
	size_t ngaps;
	bool capped;        /* a recorder reached its record cap and its calls past it could not be
	                       compared (a count without the sum "hs" of their terms, a C recorder's cap);
	                       where every member's count has its sum, counts and sums are compared
	                       (a difference is a P finding) and this stays false */
	struct audit_finding *f;
	size_t nf;
};

/* the job: every world of every attempt */
struct audit_report {
	struct audit_result *w; /* in the order of first appearance (attempt, then world) */
	size_t nw;
	struct audit_gap *gaps; /* job-level: launcher workers with nothing recorded, unreadable files */
	size_t ngaps;
	int attempts;       /* attempts seen (the highest restart count + 1) */
	struct audit_exit *exits; /* every wexit of launcher.jsonl, in its order */
	size_t nexits;
	size_t nrecords;    /* all records read */
	size_t calls;       /* the collective and point-to-point calls among them */
	size_t calls_held;  /* the most calls the analysis held at once: those its groups' ranks were
	                       apart by (the analysis streams the files merged by time), not all calls */
};

/* given NULL: infer the layout per world. hung_attempt: the attempt the
 * hang watch ended (-1 none): its ranks that stopped short of a collective
 * are reported whether or not they exited. Returns 0 or a negative errno
 * with err set (an unreadable folder); an empty folder is a report with no
 * world (nw 0). Release with audit_report_release() in every case. */
int audit_analyze_job(const char *dir, const struct dptp_layout *given, int hung_attempt, struct audit_report *rep,
		      struct dptp_err *err);
void audit_report_release(struct audit_report *r);

/* For the hang watch: 1 when every live rank of the last attempt's worlds
 * is inside a collective it entered and has not left (its last `op` has no
 * `done`) or has exited, and some rank is behind on a group: msg then names
 * the replica behind, with counts per rank ("rank 2 entered 2 all_reduce
 * on group [0,2] at x.py:7, rank 0 entered 3"). pids: the attempt's
 * recording processes still alive (no end record, no wexit) to end;
 * *attempt, that attempt's restart count. 0 when not (a rank is outside
 * any collective: it is working), or a negative errno. */
int audit_analyze_pending(const char *dir, char *msg, size_t len, pid_t *pids, size_t *npids, size_t maxpids,
			  int *attempt);

#endif
