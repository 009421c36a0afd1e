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

/* The root cause: minimum timestamp, first on ties. */
size_t failure_root(const struct failure *f, size_t n);

/* torchrun's @record on its own main: the root cause's error file copied to
 * the launcher's TORCHELASTIC_ERROR_FILE (parent_file), a nested message
 * gaining "errorCode": its exit code (as torchrun's dump_error_file; a
 * signal's exit code is negative). 0, or -1 when there is nothing to copy
 * or the file cannot be written. */
int failure_dump_root_cause(const struct failure *root, const char *parent_file);
/* torchrun's @record on its own main when the launcher itself fails (an
 * exception other than ChildFailedError: RendezvousTimeoutError,
 * SignalException, ...): parent_file gets {"message": {"message": what,
 * "extraInfo": {"py_callstack": what + newline, "timestamp": "<now>"}}}
 * (torch's py_callstack is a Python traceback ending in that line).
 * 0, or -1 when the file cannot be written. */
int failure_record_launcher(const char *parent_file, const char *what);
/* The copied text (malloc'd), NULL when text is not an error file. */
char *failure_error_json_with_code(const char *text, int code);

/* A whole text file (at most 16 MiB), malloc'd; NULL when unreadable. */
char *failure_read_text(const char *path);

/* Parses a TORCHELASTIC_ERROR_FILE's JSON text. Returns 0 and malloc'd
 * *message (py_callstack indented by two spaces, "" when it is "", or the
 * message; NULL for an empty plain message), and *timestamp; -1 when the
 * text is not an error file. */
int failure_parse_error_json(const char *text, char **message, long long *timestamp);

#endif
