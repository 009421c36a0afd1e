/* The JUnit XML report, for CI. */
#include "report/report.h"

#include <inttypes.h>
#include <stdbool.h>

#include "report/report_write.h"

static void xml_escape(FILE *f, const char *str, size_t n, bool attr)
{
	const unsigned char *s = (const unsigned char *)str;
	for (size_t i = 0, len; s && i < n; i += len) {
		uint32_t cp;
		len = utf8_step(s + i, n - i, &cp);
		switch (cp) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&apos;", f); break;
		/* A raw CR is folded away by parsers, raw tab/LF in an
		 * attribute become spaces: keep them as references. */
		case '\r': fputs("&#13;", f); break;
		case '\t': fputs(attr ? "&#9;" : "\t", f); break;
		case '\n': fputs(attr ? "&#10;" : "\n", f); break;
		default:
			if (cp == NOT_UTF8 || cp < 0x20 || cp == 0x7f || cp == 0xfffe || cp == 0xffff)
				fputs("\xef\xbf\xbd", f);
			else
				fwrite(s + i, 1, len, f);
		}
	}
}

void dptp_xml_escape(FILE *f, const char *s, size_t n)
{
	xml_escape(f, s, n, false);
}

static void xml_attr(FILE *f, const char *name, const char *v)
{
	fprintf(f, " %s=\"", name);
	xml_escape(f, or_empty(v), strlen(or_empty(v)), true);
	fputc('"', f);
}

int dptp_report_write_junit(const struct dptp_report *r, FILE *f)
{
	const char *tool = r->tool ? r->tool : "dptp-check";
	struct dptp_summary all = dptp_report_summary(r);
	double total = 0;
	for (size_t i = 0; i < r->nreplicas; i++)
		for (size_t j = 0; j < r->replicas[i].nchecks; j++)
			total += finite_or_zero(r->replicas[i].checks[j].seconds);

	fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites", f);
	xml_attr(f, "name", tool);
	fprintf(f, " tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.6f\">\n",
		all.pass + all.fail + all.skip + all.error + all.timeout,
		all.fail, all.error + all.timeout, all.skip, total);

	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		int fail = 0, err = 0, skip = 0;
		double t = 0;
		for (size_t j = 0; j < rep->nchecks; j++) {
			switch (sane(rep->checks[j].status)) {
			case DPTP_FAIL: fail++; break;
			case DPTP_ERROR:
			case DPTP_TIMEOUT: err++; break;
			case DPTP_SKIP: skip++; break;
			case DPTP_PASS: break;
			}
			t += finite_or_zero(rep->checks[j].seconds);
		}
		char suite[32];
		snprintf(suite, sizeof(suite), "dp%d", rep->dp);
		fprintf(f, "  <testsuite name=\"%s\" tests=\"%zu\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"%.6f\">\n",
			suite, rep->nchecks, fail, err, skip, t);

		fputs("    <properties>\n", f);
		fputs("      <property name=\"ranks\" value=\"", f);
		write_ranks(f, rep->ranks, rep->nranks);
		fputs("\"/>\n", f);
		fprintf(f, "      <property name=\"layout\" value=\"world=%d dp=%d pp=%d tp=%d\"/>\n",
			r->world, r->dp, r->pp, r->tp);
		fputs("      <property name=\"backend\"", f);
		xml_attr(f, "value", r->backend);
		fputs("/>\n      <property name=\"bootstrap\"", f);
		xml_attr(f, "value", r->bootstrap);
		fputs("/>\n", f);
		if (r->engine) {
			fputs("      <property name=\"engine\"", f);
			xml_attr(f, "value", r->engine);
			fputs("/>\n", f);
		}
		fprintf(f, "      <property name=\"seed\" value=\"%" PRIu64 "\"/>\n", r->seed);
		fputs("      <property name=\"inject\" value=\"", f);
		for (size_t k = 0; k < r->ninject; k++) {
			if (k)
				fputc(',', f);
			xml_escape(f, or_empty(r->inject[k]), strlen(or_empty(r->inject[k])), true);
		}
		fputs("\"/>\n    </properties>\n", f);

		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			const char *detail = or_empty(c->detail);
			size_t dlen = strlen(detail);
			fputs("    <testcase classname=\"", f);
			xml_escape(f, tool, strlen(tool), true);
			fprintf(f, ".%s\" name=\"%s/", suite, suite);
			xml_escape(f, c->name, name_len(c), true);
			fprintf(f, "\" time=\"%.6f\"", finite_or_zero(c->seconds));
			enum dptp_status st = sane(c->status);
			if (st == DPTP_PASS && !dlen) {
				fputs("/>\n", f);
				continue;
			}
			fputs(">\n", f);
			const char *elem = NULL, *type = dptp_status_name(st);
			switch (st) {
			case DPTP_FAIL: elem = "failure"; break;
			case DPTP_ERROR:
			case DPTP_TIMEOUT: elem = "error"; break;
			case DPTP_SKIP: elem = "skipped"; break;
			case DPTP_PASS: break;
			}
			if (elem) {
				fprintf(f, "      <%s", elem);
				if (st != DPTP_SKIP)
					fprintf(f, " type=\"%s\"", type);
				fputs(" message=\"", f);
				if (dlen)
					xml_escape(f, detail, first_line(detail), true);
				else
					fputs(type, f);
				fputs("\"", f);
				if (st == DPTP_SKIP || !dlen) {
					fputs("/>\n", f);
				} else {
					fputc('>', f);
					dptp_xml_escape(f, detail, dlen);
					fprintf(f, "</%s>\n", elem);
				}
			}
			if (dlen && (st == DPTP_PASS || (st == DPTP_SKIP && first_line(detail) < dlen))) {
				fputs("      <system-out>", f);
				dptp_xml_escape(f, detail, dlen);
				fputs("</system-out>\n", f);
			}
			fputs("    </testcase>\n", f);
		}
		fputs("  </testsuite>\n", f);
	}
	fputs("</testsuites>\n", f);
	return finish(f);
}
