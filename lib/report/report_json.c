/* The JSON report (DESIGN.md's schema; names are a contract). */
#include "report/report.h"
#include "report/report_write.h"

void dptp_json_escape(FILE *f, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	for (size_t i = 0, len; s && i < n; i += len) {
		uint32_t cp;
		len = utf8_step(s + i, n - i, &cp);
		if (cp == NOT_UTF8)
			fputs("\\ufffd", f);
		else if (cp == '"')
			fputs("\\\"", f);
		else if (cp == '\\')
			fputs("\\\\", f);
		else if (cp < 0x20 || cp == 0x7f)
			fprintf(f, "\\u%04x", (unsigned)cp);
		else if (cp == 0x2028 || cp == 0x2029) /* JavaScript line ends */
			fprintf(f, "\\u%04x", (unsigned)cp);
		else
			fwrite(s + i, 1, len, f);
	}
}

static void json_str(FILE *f, const char *s)
{
	if (!s) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	dptp_json_escape(f, s, strlen(s));
	fputc('"', f);
}

/* JSON has no NaN or infinity; a non-finite time is reported as 0. */
static void json_num(FILE *f, double v)
{
	if (!isfinite(v))
		v = 0;
	fprintf(f, "%.9g", v);
}

int dptp_report_write_json(const struct dptp_report *r, FILE *f)
{
	fputs("{\"tool\": ", f);
	json_str(f, r->tool ? r->tool : "dptp-check");
	fputs(", \"version\": ", f);
	json_str(f, r->version ? r->version : DPTP_VERSION);
	fprintf(f, ",\n \"layout\": {\"world\": %d, \"dp\": %d, \"pp\": %d, \"tp\": %d},\n",
		r->world, r->dp, r->pp, r->tp);
	fputs(" \"backend\": ", f);
	json_str(f, r->backend);
	fputs(", \"bootstrap\": ", f);
	json_str(f, r->bootstrap);
	if (r->engine) {
		fputs(", \"engine\": ", f);
		json_str(f, r->engine);
	}
	fprintf(f, ", \"seed\": %" PRIu64 ",\n \"inject\": [", r->seed);
	for (size_t i = 0; i < r->ninject; i++) {
		if (i)
			fputs(", ", f);
		json_str(f, r->inject[i]);
	}
	fputs("],\n \"replicas\": [", f);
	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		fprintf(f, "%s\n  {\"dp\": %d, \"ranks\": [", i ? "," : "", rep->dp);
		for (int k = 0; k < rep->nranks; k++)
			fprintf(f, "%s%d", k ? ", " : "", rep->ranks[k]);
		fprintf(f, "], \"status\": \"%s\",\n   \"checks\": [", dptp_status_name(rep->status));
		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			fprintf(f, "%s\n    {\"name\": \"", j ? "," : "");
			dptp_json_escape(f, c->name, name_len(c));
			fprintf(f, "\", \"status\": \"%s\", \"seconds\": ", dptp_status_name(c->status));
			json_num(f, c->seconds);
			fputs(", \"detail\": \"", f);
			dptp_json_escape(f, or_empty(c->detail), strlen(or_empty(c->detail)));
			if (c->status == DPTP_FAIL && c->mech) {
				fputs("\", \"mechanism\": \"", f);
				dptp_json_escape(f, c->mech, strlen(c->mech));
			}
			fputs("\"}", f);
		}
		fputs(rep->nchecks ? "\n   ]}" : "]}", f);
	}
	fputs(r->nreplicas ? "\n ],\n" : "],\n", f);
	if (r->nbench > 0) {
		fputs(" \"bench\": [", f);
		for (size_t i = 0; i < r->nbench; i++) {
			const struct dptp_bench_row *b = &r->bench[i];
			fprintf(f, "%s\n  {\"tp\": %d, \"tokens\": %d, \"hidden\": %d, \"dtype\": ",
				i ? "," : "", b->tp, b->tokens, b->hidden);
			fputc('"', f);
			dptp_json_escape(f, b->dtype, strnlen(b->dtype, sizeof(b->dtype)));
			fputs("\", \"fused_us\": ", f);
			json_num(f, b->fused_us);
			fputs(", \"unfused_us\": ", f);
			json_num(f, b->unfused_us);
			fputs(", \"speedup\": ", f);
			if (b->tp > 1)
				json_num(f, b->speedup);
			else
				fputs("null", f); /* TP 1: nothing is fused */
			fputs(", \"fused_busbw_gbs\": ", f);
			json_num(f, b->fused_busbw_gbs);
			fputs(", \"unfused_busbw_gbs\": ", f);
			json_num(f, b->unfused_busbw_gbs);
			fputc('}', f);
		}
		fputs("\n ],\n", f);
	}
	struct dptp_summary s = dptp_report_summary(r);
	fprintf(f, " \"summary\": {\"pass\": %d, \"fail\": %d, \"skip\": %d, \"error\": %d, \"timeout\": %d}}\n",
		s.pass, s.fail, s.skip, s.error, s.timeout);
	return finish(f);
}
