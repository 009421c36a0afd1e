/* Worker logs: torchrun's --log-dir layout
 * <log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/{stdout,stderr}.log,
 * and tee'd streams copied line by line to the console with a prefix. */
#ifndef DPTP_LAUNCHER_LOGS_H
#define DPTP_LAUNCHER_LOGS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

struct logs_dirs {
	bool devnull;      /* --log-dir /dev/null: no files at all */
	char *base_created; /* the /tmp/torchelastic_XXXXXXXX we made, or NULL */
	char *run_dir;     /* <log_dir>/<run_id>_<random> */
};

/* log_dir NULL: tempfile.mkdtemp(prefix="torchelastic_"). */
int logs_dirs_init(struct logs_dirs *d, const char *log_dir, const char *run_id, struct dptp_err *err);
/* Creates attempt_<n>/<0..nlocal-1>/; returns attempt dir (malloc'd) in *out. */
int logs_dirs_attempt(struct logs_dirs *d, unsigned attempt, unsigned nlocal, char **out, struct dptp_err *err);
/* Removes the default tmp base, but for the directories that hold a file
 * the run wrote (a log, an error file). */
void logs_dirs_release(struct logs_dirs *d);

/* One tee'd stream: a pipe from the worker, copied raw to file_fd and, line
 * by line with prefix, to console_fd. A line is written whole, in one
 * write(2), so lines of different workers never interleave mid-line. */
/* --duplicate-stdout/stderr-filters, parsed as torch's comma_separated_list
 * (",," is a literal comma): a line matches when it contains any needle; an
 * empty needle matches every line. n == 0: the option was not given. */
struct logs_filters {
	char **needle;
	size_t n;
};

/* spec NULL: no filters. Returns 0 or -ENOMEM. */
int logs_filters_parse(const char *spec, struct logs_filters *f);
bool logs_filters_match(const struct logs_filters *f, const char *line, size_t len);
void logs_filters_release(struct logs_filters *f);

struct logs_stream {
	int fd;          /* read end, -1 when closed */
	int file_fd;     /* -1: no file */
	int console_fd;  /* -1: not shown */
	int dup_fd;      /* -1: none; else each shown line that matches dup goes there too */
	const struct logs_filters *dup;
	char *prefix;
	size_t prefix_len;
	char *buf;
	size_t len, cap;
};

void logs_stream_init(struct logs_stream *ls);
/* Takes ownership of fd, file_fd and prefix. */
int logs_stream_open(struct logs_stream *ls, int fd, int file_fd, int console_fd, char *prefix);
/* Also copies the lines shown on the console that match f, with their
 * prefix, to fd (neither is owned; both must outlive the stream). */
void logs_stream_duplicate(struct logs_stream *ls, int fd, const struct logs_filters *f);
/* Reads what is available. Returns 1 at EOF (stream flushed and closed). */
int logs_stream_pump(struct logs_stream *ls);
/* Flushes a partial last line (with a newline) and closes everything. */
void logs_stream_release(struct logs_stream *ls);

#endif
