/* Per-rank results gathered to rank 0 over the bootstrap and merged into
 * per-replica verdicts (worst status of the replica's ranks). */
#ifndef DPTP_LIB_GATHER_H
#define DPTP_LIB_GATHER_H

#include "base/layout.h"
#include "bootstrap/bootstrap.h"
#include "report/report.h"

/* Collective. res[nres] are this rank's results in check order. On rank 0,
 * fills r->replicas (caller releases with dptp_report_release); ranks whose
 * results never came are `timeout`, those whose results could not be read
 * `error`, with a detail saying so. `timeout` bounds the exchange. Returns
 * 0; -ETIMEDOUT when some ranks were missing, -EPROTO when some results
 * could not be read (the message names those ranks: "1 of 4 ranks never
 * reported: 3"); -ENOMEM when the report could not be built (it may be
 * incomplete); on the other ranks, a publishing error. */
int dptp_gather_results(struct dptp_bootstrap *b, const struct dptp_layout *l,
			const struct dptp_check_result *res, size_t nres, double timeout,
			struct dptp_report *r, struct dptp_err *err);

/* Gets a key that `rank` publishes without a fence (see
 * dptp_bootstrap_publish), waiting until the absolute deadline. */
int dptp_fetch_published(struct dptp_bootstrap *b, int rank, const char *key, double deadline,
			 void **data, size_t *len, struct dptp_err *err);

/* Serialisation, exposed for tests. */
int dptp_results_pack(const struct dptp_check_result *res, size_t nres, void **out, size_t *len);
int dptp_results_unpack(const void *buf, size_t len, struct dptp_check_result *res, size_t nres);

/* Merges per-rank rows (ranks[world][nres]) into replicas. */
int dptp_results_merge(const struct dptp_layout *l, struct dptp_check_result *const *rows,
		       size_t nres, struct dptp_report *r);

#endif
