/* The launcher's own log lines, in the glog style torch's launcher uses. */
#ifndef DPTP_LAUNCHER_GLOG_H
#define DPTP_LAUNCHER_GLOG_H

#include <stdarg.h>
#include <stddef.h>

/* glog-style line prefix torch uses: "W1202 13:53:04.905000 621 dptp-run] " */
void glog_prefix(char level, char *buf, size_t len);
/* One such line on stderr: the prefix, the message, a newline. */
__attribute__((format(printf, 2, 0)))
void glog_vlog(char level, const char *fmt, va_list ap);

#endif
