/* What the report writers share (report.c, report_text.c, report_json.c,
 * report_junit.c): small pure helpers, private to lib/report. */
#ifndef DPTP_REPORT_WRITE_H
#define DPTP_REPORT_WRITE_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/utf8.h"
#include "report/report.h"

#ifndef DPTP_VERSION
#define DPTP_VERSION "unknown"
#endif

/* Unknown status values count as errors, as in the summary. */
static inline enum dptp_status sane(enum dptp_status s)
{
	return (unsigned)s <= DPTP_TIMEOUT ? s : DPTP_ERROR;
}

/* Strict UTF-8, surrogates refused (base/utf8.h). */
static inline size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
	return dptp_utf8_next(s, n, 0, cp);
}

/* utf8_next, one step at a time: an invalid byte is one step of NOT_UTF8. */
#define NOT_UTF8 UINT32_MAX
static inline size_t utf8_step(const unsigned char *s, size_t n, uint32_t *cp)
{
	size_t len = utf8_next(s, n, cp);
	if (len == 0)
		*cp = NOT_UTF8;
	return len ? len : 1;
}

static inline const char *or_empty(const char *s)
{
	return s ? s : "";
}

static inline double finite_or_zero(double v)
{
	return isfinite(v) && v > 0 ? v : 0;
}

static inline size_t name_len(const struct dptp_check_result *c)
{
	return strnlen(c->name, sizeof(c->name));
}

/* First line of a detail, for the message attribute. */
static inline size_t first_line(const char *s)
{
	size_t n = strcspn(s, "\n");
	return n > 200 ? 200 : n;
}

/* Ranks as "0-3,8,10-11". */
static inline void write_ranks(FILE *f, const int *ranks, int n)
{
	for (int i = 0; i < n;) {
		int j = i;
		while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
			j++;
		fprintf(f, "%s%d", i ? "," : "", ranks[i]);
		if (j > i)
			fprintf(f, "%s%d", j == i + 1 ? "," : "-", ranks[j]);
		i = j + 1;
	}
}

static inline int finish(FILE *f)
{
	return ferror(f) ? -EIO : 0;
}

#endif
