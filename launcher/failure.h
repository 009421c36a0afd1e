/* torchrun's failure report (elastic/multiprocessing/errors/__init__.py). */
#ifndef DPTP_LAUNCHER_FAILURE_H
#define DPTP_LAUNCHER_FAILURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

struct failure {
	unsigned local_rank, global_rank;
	pid_t pid;
	int exitcode;      /* negative: killed by that signal */
	long long timestamp;
	char *error_file;  /* path, or NULL for <N/A> */
	char *message;     /* what "traceback :" shows */
};

/* Fills f from a finished worker: reads error_file when the worker wrote it
 * (its message, py_callstack and timestamp), else torchrun's default
 * message. Takes nothing; f owns copies. abort_msg: PMIx_Abort's message. */
void failure_init(struct failure *f, unsigned local_rank, unsigned global_rank, pid_t pid,
	int exitcode, const char *error_file, const char *abort_msg);
void failure_release(struct failure *f);

/* Writes the report: name FAILED, other failures, root cause (minimum
 * timestamp, first on ties). */
void failure_report_write(FILE *out, const char *name, const struct failure *f, size_t n, const char *host);

/* Parses a TORCHELASTIC_ERROR_FILE's JSON text. Returns 0 and malloc'd
 * *message (py_callstack indented by two spaces, or the message), and
 * *timestamp; -1 when the text is not an error file. */
int failure_parse_error_json(const char *text, char **message, long long *timestamp);

#endif
