#include "report/gather.h"
#include "base/buf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wire {
	char name[32];
	int32_t status;
	uint32_t detail_len;
	double seconds;
};

int dptp_results_pack(const struct dptp_check_result *res, size_t nres, void **out, size_t *len)
{
	size_t n = sizeof(uint32_t);
	for (size_t i = 0; i < nres; i++)
		n += sizeof(struct wire) + (res[i].detail ? strlen(res[i].detail) : 0);
	unsigned char *p = malloc(n), *q = p;
	if (!p)
		return -ENOMEM;
	uint32_t cnt = (uint32_t)nres;
	memcpy(q, &cnt, sizeof(cnt));
	q += sizeof(cnt);
	for (size_t i = 0; i < nres; i++) {
		struct wire w = {0};
		snprintf(w.name, sizeof(w.name), "%s", res[i].name);
		w.status = (int32_t)res[i].status;
		w.seconds = res[i].seconds;
		w.detail_len = res[i].detail ? (uint32_t)strlen(res[i].detail) : 0;
		memcpy(q, &w, sizeof(w));
		q += sizeof(w);
		memcpy(q, res[i].detail ? res[i].detail : "", w.detail_len);
		q += w.detail_len;
	}
	*out = p;
	*len = n;
	return 0;
}

int dptp_results_unpack(const void *buf, size_t len, struct dptp_check_result *res, size_t nres)
{
	const unsigned char *p = buf, *end = p + len;
	uint32_t cnt;
	size_t i = 0;
	if (len < sizeof(cnt))
		return -EPROTO;
	memcpy(&cnt, p, sizeof(cnt));
	p += sizeof(cnt);
	if (cnt != nres)
		return -EPROTO;
	for (i = 0; i < nres; i++) {
		struct wire w;
		if ((size_t)(end - p) < sizeof(w))
			goto bad;
		memcpy(&w, p, sizeof(w));
		p += sizeof(w);
		if ((size_t)(end - p) < w.detail_len || w.status < DPTP_SKIP || w.status > DPTP_TIMEOUT)
			goto bad;
		memset(&res[i], 0, sizeof(res[i]));
		memcpy(res[i].name, w.name, sizeof(res[i].name) - 1);
		res[i].status = (enum dptp_status)w.status;
		res[i].seconds = w.seconds;
		res[i].detail = malloc((size_t)w.detail_len + 1); /* not NUL-terminated on the wire */
		if (!res[i].detail)
			goto bad;
		memcpy(res[i].detail, p, w.detail_len);
		res[i].detail[w.detail_len] = 0;
		p += w.detail_len;
	}
	return 0;
bad:
	/* nothing half-filled is left to the caller */
	while (i-- > 0) {
		free(res[i].detail);
		res[i].detail = NULL;
	}
	return -EPROTO;
}

int dptp_results_merge(const struct dptp_layout *l, struct dptp_check_result *const *rows,
		       size_t nres, struct dptp_report *r)
{
	r->nreplicas = (size_t)l->dp;
	r->replicas = calloc((size_t)l->dp, sizeof(*r->replicas));
	if (!r->replicas)
		return -ENOMEM;
	int per = l->world / l->dp;
	for (int d = 0; d < l->dp; d++) {
		struct dptp_replica_result *rep = &r->replicas[d];
		rep->dp = d;
		rep->nranks = per;
		rep->ranks = calloc((size_t)per, sizeof(int));
		rep->checks = calloc(nres ? nres : 1, sizeof(*rep->checks));
		if (!rep->ranks || !rep->checks)
			return -ENOMEM;
		rep->nchecks = nres;
		for (int i = 0; i < per; i++)
			rep->ranks[i] = d * per + i; /* replica d = ranks with dp index d */
		rep->status = DPTP_SKIP;
		bool any = false;
		for (size_t k = 0; k < nres; k++) {
			struct dptp_check_result *out = &rep->checks[k];
			enum dptp_status worst = DPTP_SKIP;
			bool first = true;
			for (int i = 0; i < per; i++) {
				const struct dptp_check_result *x = &rows[rep->ranks[i]][k];
				if (first) {
					memcpy(out->name, x->name, sizeof(out->name));
					worst = x->status;
					first = false;
				} else {
					worst = dptp_status_worst(worst, x->status);
				}
				if (x->seconds > out->seconds)
					out->seconds = x->seconds;
			}
			out->status = worst;
			/* the detail: the ranks that gave the verdict, each once */
			struct dptp_buf s = {0};
			for (int i = 0; i < per; i++) {
				const struct dptp_check_result *x = &rows[rep->ranks[i]][k];
				if (x->status != worst || !x->detail || !*x->detail)
					continue;
				if (worst <= DPTP_PASS && s.len) /* pass/skip: one rank's words suffice */
					break;
				dptp_buf_addf(&s, "%srank %d: ", s.len ? "; " : "", rep->ranks[i]);
				dptp_buf_adds(&s, x->detail);
			}
			out->detail = dptp_buf_detach(&s, NULL);
			if (!out->detail)
				out->detail = strdup("");
			if (!any) {
				rep->status = worst;
				any = true;
			} else {
				rep->status = dptp_status_worst(rep->status, worst);
			}
		}
	}
	return 0;
}

int dptp_fetch_published(struct dptp_bootstrap *b, int rank, const char *key, double deadline,
			 void **data, size_t *len, struct dptp_err *err)
{
	/* some PMIx servers answer "not found" at once for a key that is not
	 * committed yet, others wait, and some give up on their own before the
	 * deadline (Open MPI's prte: "timed out" after 2 s of a 3 s wait, once
	 * a fence had timed out): ask again until the deadline */
	for (;;) {
		double left = deadline - dptp_now();
		int rc = dptp_bootstrap_get(b, rank, key, data, len, left > 0.01 ? left : 0.01, err);
		if ((rc != -ENOENT && rc != -ETIMEDOUT) || dptp_now() >= deadline)
			return rc;
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
}

/* Appends " r" (", r" after the first) to a list of ranks, at most 16
 * of them, then " ...". */
static void list_rank(char *buf, size_t n, int count, int rank)
{
	size_t off = strlen(buf);
	if (count <= 16 && off < n)
		snprintf(buf + off, n - off, "%s%d%s", count > 1 ? ", " : " ", rank, count == 16 ? " ..." : "");
}

/* Rank q's row when its results are not there: every check `s` with why. */
static void row_lost(struct dptp_check_result *row, const struct dptp_check_result *res, size_t nres,
		     enum dptp_status s, const char *why)
{
	for (size_t k = 0; k < nres; k++) {
		free(row[k].detail);
		memcpy(row[k].name, res[k].name, sizeof(res[k].name));
		row[k].status = s;
		row[k].seconds = 0;
		row[k].detail = strdup(why);
	}
}

int dptp_gather_results(struct dptp_bootstrap *b, const struct dptp_layout *l,
			const struct dptp_check_result *res, size_t nres, double timeout,
			struct dptp_report *r, struct dptp_err *err)
{
	int world = l->world, rc = 0;
	void *mine = NULL;
	size_t mlen = 0;
	if (dptp_results_pack(res, nres, &mine, &mlen) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	/* no fence: a rank that stopped mid-collective must not keep rank 0
	 * from reporting the others; each rank publishes, rank 0 fetches */
	if (b->rank != 0) {
		rc = dptp_bootstrap_publish(b, "dptp.results", mine, mlen, err);
		if (rc < 0)
			dptp_err_prefix(err, "publishing this rank's results");
		free(mine);
		return rc;
	}
	double deadline = dptp_now() + timeout;
	struct dptp_check_result **rows = calloc((size_t)world, sizeof(*rows));
	int missing = 0, unread = 0;
	char missing_list[160] = "", unread_list[160] = "";
	for (int q = 0; rows && q < world; q++) {
		rows[q] = calloc(nres ? nres : 1, sizeof(**rows));
		if (!rows[q]) {
			rc = dptp_err_set(err, -ENOMEM, "out of memory");
			break;
		}
		int got = -1, grc = 0;
		if (q == 0) {
			got = dptp_results_unpack(mine, mlen, rows[q], nres);
		} else {
			void *data = NULL;
			size_t len = 0;
			struct dptp_err e = {0};
			grc = dptp_fetch_published(b, q, "dptp.results", deadline, &data, &len, &e);
			if (grc == 0)
				got = dptp_results_unpack(data, len, rows[q], nres);
			free(data);
		}
		if (got == 0)
			continue;
		if (grc < 0) {
			list_rank(missing_list, sizeof(missing_list), ++missing, q);
			row_lost(rows[q], res, nres, DPTP_TIMEOUT,
				 "no result from this rank: it never reported (stopped, or stuck in a collective)");
		} else {
			/* came, but not as this rank's results of these checks */
			list_rank(unread_list, sizeof(unread_list), ++unread, q);
			row_lost(rows[q], res, nres, DPTP_ERROR,
				 "this rank's results could not be read (another dptp-check version, or other checks?)");
		}
	}
	if (!rows)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	else if (rc == 0 && dptp_results_merge(l, rows, nres, r) < 0)
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
	else if (rc == 0 && missing)
		rc = dptp_err_set(err, -ETIMEDOUT, "%d of %d ranks never reported:%s%s%s%s", missing, world,
				  missing_list, unread ? "; results that could not be read from rank" : "",
				  unread > 1 ? "s" : "", unread_list);
	else if (rc == 0 && unread)
		rc = dptp_err_set(err, -EPROTO, "results that could not be read from rank%s%s", unread > 1 ? "s" : "",
				  unread_list);
	for (int q = 0; rows && q < world; q++) {
		for (size_t k = 0; rows[q] && k < nres; k++)
			free(rows[q][k].detail);
		free(rows[q]);
	}
	free(rows);
	free(mine);
	return rc;
}
