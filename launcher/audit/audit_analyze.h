/* dptp-run --audit: the analysis of what the recorders wrote (the record
 * format is lib/base/audit_rec.h). Reads the audit folder of one job, keeps
 * its last attempt, infers the DP x PP x TP layout from the groups the
 * program created (or takes the one given), and finds the family's
 * mechanisms (reference/FAMILY.md) per DP replica:
 *   P  members of one group disagree on its collective sequence
 *   R  a src/dst outside the call's group; the same numeric peer on every
 *      replica
 *   I  one socket or shared-memory name bound or created by several ranks
 *   C  one port bound by ranks of different replicas
 *   G  a broadcast loop over a group spanning replicas whose sources are not
 *      one per replica; a per-replica socket or segment used across replicas
 *   D  two ranks of one host on one device; a device not LOCAL_RANK's */
#ifndef DPTP_LAUNCHER_AUDIT_ANALYZE_H
#define DPTP_LAUNCHER_AUDIT_ANALYZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/layout.h"
#include "base/util.h"

struct audit_finding {
	char mech;          /* 'P', 'R', 'I', 'C', 'G', 'D' */
	int *ranks;         /* owned, sorted */
	size_t nranks;
	int *replicas;      /* owned, sorted; none when the layout is unknown */
	size_t nreplicas;
	char *site;         /* owned, "file:line" or "" */
	char op[48];
	int *group;         /* owned: the call's group, global ranks; may be empty */
	size_t ngroup;
	char *detail;       /* owned: the evidence, one sentence */
};

struct audit_result {
	int world;          /* 0: nothing was recorded */
	int attempt;        /* the restart count analysed */
	bool layout_known;
	struct dptp_layout layout;
	char layout_how[256]; /* "given", "inferred from ...", or why not */
	size_t nrecorded;   /* ranks with records */
	size_t nrecords;
	struct audit_finding *f;
	size_t nf;
};

/* given NULL: infer the layout. hung: the job ended by --audit-hang (the
 * ranks that stopped short of a collective are reported whether or not
 * they exited). Returns 0 or a negative errno with err set
 * (an unreadable folder); an empty folder is a result with world 0. */
int audit_analyze(const char *dir, const struct dptp_layout *given, bool hung, struct audit_result *res,
		  struct dptp_err *err);
void audit_analyze_result_release(struct audit_result *r);

/* For --audit-hang: the collectives some ranks entered and others never did
 * (a rank that raised is left out), as one message; the pids of the last
 * attempt's recording workers; *attempt, that attempt's restart count.
 * Returns 1 when something is pending, 0 when
 * not, or a negative errno. */
int audit_analyze_pending(const char *dir, char *msg, size_t len, pid_t *pids, size_t *npids, size_t maxpids, int *attempt);

#endif
