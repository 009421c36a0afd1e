/* The text report, for people at a terminal. */
#include "report/report.h"

#include <inttypes.h>
#include <stdbool.h>

#include "report/report_write.h"

static const char *status_color(enum dptp_status s)
{
	switch (s) {
	case DPTP_PASS: return "\033[32m";
	case DPTP_SKIP: return "\033[33m";
	case DPTP_FAIL: return "\033[1;31m";
	case DPTP_ERROR: return "\033[1;35m";
	case DPTP_TIMEOUT: return "\033[1;31m";
	}
	return "";
}

/* Upper-case status word padded to width, colored when asked. */
static void put_status(FILE *f, enum dptp_status s, bool color, int width)
{
	char word[16];
	const char *name = dptp_status_name(s);
	size_t i;
	for (i = 0; name[i] && i + 1 < sizeof(word); i++)
		word[i] = (char)(name[i] - 'a' + 'A');
	word[i] = 0;
	if (color)
		fprintf(f, "%s%s\033[0m", status_color(s), word);
	else
		fputs(word, f);
	for (int k = (int)i; k < width; k++)
		fputc(' ', f);
}

/* Writes n bytes for a terminal: valid UTF-8 as is, control bytes and
 * invalid bytes as \xNN, so a detail cannot drive the terminal; each
 * newline is followed by indent. */
static void text_bytes(FILE *f, const char *str, size_t n, const char *indent)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;
	while (i < n) {
		uint32_t cp;
		size_t len = utf8_next(s + i, n - i, &cp);
		if (len == 1 && cp == '\n') {
			fputc('\n', f);
			fputs(indent, f);
		} else if (len == 0 || cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0)) {
			if (len == 0)
				len = 1;
			for (size_t k = 0; k < len; k++)
				fprintf(f, "\\x%02x", s[i + k]);
		} else {
			fwrite(s + i, 1, len, f);
		}
		i += len;
	}
}

int dptp_report_write_text(const struct dptp_report *r, FILE *f, bool color, int verbose)
{
	fprintf(f, "%s %s: world %d = dp %d x pp %d x tp %d, backend %s, bootstrap %s",
		r->tool ? r->tool : "dptp-check", r->version ? r->version : DPTP_VERSION,
		r->world, r->dp, r->pp, r->tp, r->backend ? r->backend : "?",
		r->bootstrap ? r->bootstrap : "?");
	if (r->engine)
		fprintf(f, " (%s)", r->engine);
	fprintf(f, ", seed %" PRIu64 "\n", r->seed);
	if (r->ninject) {
		fputs("inject:", f);
		for (size_t i = 0; i < r->ninject; i++)
			fprintf(f, "%s%s", i ? ", " : " ", or_empty(r->inject[i]));
		fputc('\n', f);
	}

	int namew = 5;
	for (size_t i = 0; i < r->nreplicas; i++)
		for (size_t j = 0; j < r->replicas[i].nchecks; j++) {
			int n = (int)name_len(&r->replicas[i].checks[j]);
			if (n > namew)
				namew = n;
		}

	for (size_t i = 0; i < r->nreplicas; i++) {
		const struct dptp_replica_result *rep = &r->replicas[i];
		fprintf(f, "\nDP replica %d (rank%s ", rep->dp, rep->nranks == 1 ? "" : "s");
		write_ranks(f, rep->ranks, rep->nranks);
		fputs("): ", f);
		put_status(f, rep->status, color, 0);
		fputc('\n', f);
		for (size_t j = 0; j < rep->nchecks; j++) {
			const struct dptp_check_result *c = &rep->checks[j];
			const char *d = or_empty(c->detail);
			size_t dlen = strlen(d);
			fputs("  ", f);
			text_bytes(f, c->name, name_len(c), "");
			fprintf(f, "%*s  ", namew - (int)name_len(c), "");
			put_status(f, c->status, color, 7);
			fprintf(f, " %9.4fs", finite_or_zero(c->seconds));
			if (dlen) {
				fputs("  ", f);
				if (verbose > 0) {
					text_bytes(f, d, dlen, "      ");
				} else {
					size_t n = first_line(d);
					text_bytes(f, d, n, "");
					if (n < dlen)
						fputs(" ...", f);
				}
			}
			fputc('\n', f);
		}
	}

	bool tp1 = r->nbench > 0;
	for (size_t i = 0; i < r->nbench; i++)
		tp1 &= r->bench[i].tp == 1;
	if (tp1) {
		fprintf(f, "\nbench at TP 1: there is no allreduce to fuse. fused_us is the residual + RMSNorm "
			   "kernel alone, unfused_us NCCL's one-rank allreduce + the same kernel; no speedup\n");
	} else if (r->nbench > 0) {
		fprintf(f, "\nbench: fused vs unfused allreduce + residual + RMSNorm\n");
	}
	if (r->nbench > 0) {
		fprintf(f, "  %4s %7s %7s %5s %12s %12s %8s %12s %12s\n", "tp", "tokens", "hidden",
			"dtype", "fused_us", "unfused_us", "speedup", "fused_GB/s", "unfused_GB/s");
		for (size_t i = 0; i < r->nbench; i++) {
			const struct dptp_bench_row *b = &r->bench[i];
			fputs("  ", f);
			fprintf(f, "%4d %7d %7d ", b->tp, b->tokens, b->hidden);
			size_t dl = strnlen(b->dtype, sizeof(b->dtype));
			text_bytes(f, b->dtype, dl, "");
			fprintf(f, "%*s %12.2f %12.2f ", 5 - (int)dl, "", b->fused_us, b->unfused_us);
			if (b->tp > 1)
				fprintf(f, "%7.2fx", b->speedup);
			else
				fprintf(f, "%8s", "-");
			fprintf(f, " %12.2f %12.2f\n", b->fused_busbw_gbs, b->unfused_busbw_gbs);
		}
	}

	/* a --bench report has no replicas: no summary of none */
	if (r->nreplicas > 0 || r->nbench == 0) {
		struct dptp_summary s = dptp_report_summary(r);
		fprintf(f, "\nsummary: %d pass, %d fail, %d skip, %d error, %d timeout over %zu replica%s: ",
			s.pass, s.fail, s.skip, s.error, s.timeout, r->nreplicas,
			r->nreplicas == 1 ? "" : "s");
		put_status(f, dptp_report_worst(r), color, 0);
		fputc('\n', f);
	}
	return finish(f);
}
