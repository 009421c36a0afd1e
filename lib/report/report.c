/* Report results (see report.h): status names, the summary, the worst
 * status and its exit code, the writer for a format, and freeing. The
 * writers live one format to a file: report_text.c, report_json.c,
 * report_junit.c; report_file.c writes any of them to a file atomically. */
#include "report/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "report/report_write.h"

static const char *const status_names[] = {
	[DPTP_SKIP] = "skip",
	[DPTP_PASS] = "pass",
	[DPTP_FAIL] = "fail",
	[DPTP_ERROR] = "error",
	[DPTP_TIMEOUT] = "timeout",
};

const char *dptp_status_name(enum dptp_status s)
{
	if ((unsigned)s < DPTP_ARRAY_LEN(status_names))
		return status_names[s];
	return "error";
}

int dptp_status_parse(const char *name)
{
	if (!name)
		return -1;
	for (size_t i = 0; i < DPTP_ARRAY_LEN(status_names); i++)
		if (strcmp(status_names[i], name) == 0)
			return (int)i;
	return -1;
}

enum dptp_status dptp_status_worst(enum dptp_status a, enum dptp_status b)
{
	return a > b ? a : b;
}

struct dptp_summary dptp_report_summary(const struct dptp_report *r)
{
	struct dptp_summary s = {0};
	for (size_t i = 0; r && i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		for (size_t j = 0; j < rep->nchecks; j++) {
			switch (rep->checks[j].status) {
			case DPTP_PASS: s.pass++; break;
			case DPTP_FAIL: s.fail++; break;
			case DPTP_SKIP: s.skip++; break;
			case DPTP_TIMEOUT: s.timeout++; break;
			case DPTP_ERROR:
			default: s.error++; break;
			}
		}
	}
	return s;
}

enum dptp_status dptp_report_worst(const struct dptp_report *r)
{
	enum dptp_status w = DPTP_SKIP;
	size_t pairs = 0;
	for (size_t i = 0; r && i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		w = dptp_status_worst(w, sane(rep->status));
		pairs += rep->nchecks;
		for (size_t j = 0; j < rep->nchecks; j++)
			w = dptp_status_worst(w, sane(rep->checks[j].status));
	}
	/* nothing checked is no pass: results lost on the way */
	return pairs ? w : DPTP_ERROR;
}

int dptp_report_exit_code(const struct dptp_report *r)
{
	switch (dptp_report_worst(r)) {
	case DPTP_SKIP:
	case DPTP_PASS: return 0;
	case DPTP_FAIL: return 1;
	case DPTP_TIMEOUT: return 4;
	case DPTP_ERROR:
	default: return 3;
	}
}

int dptp_report_write(const struct dptp_report *r, enum dptp_format fmt, FILE *f,
		      bool color, int verbose)
{
	switch (fmt) {
	case DPTP_FORMAT_TEXT: return dptp_report_write_text(r, f, color, verbose);
	case DPTP_FORMAT_JSON: return dptp_report_write_json(r, f);
	case DPTP_FORMAT_JUNIT: return dptp_report_write_junit(r, f);
	}
	return -EINVAL;
}

void dptp_report_release(struct dptp_report *r)
{
	if (!r)
		return;
	for (size_t i = 0; r->replicas && i < r->nreplicas; i++) {
		struct dptp_replica_result *rep = &r->replicas[i];
		for (size_t j = 0; rep->checks && j < rep->nchecks; j++)
			free(rep->checks[j].detail);
		free(rep->checks);
		free(rep->ranks);
	}
	free(r->replicas);
	r->replicas = NULL;
	r->nreplicas = 0;
}
