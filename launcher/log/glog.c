/* The launcher's log lines (see glog.h). */
#include "log/glog.h"

#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

void glog_prefix(char level, char *buf, size_t len)
{
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	localtime_r(&tv.tv_sec, &tm);
	snprintf(buf, len, "%c%02d%02d %02d:%02d:%02d.%06ld %d dptp-run] ", level, tm.tm_mon + 1, tm.tm_mday,
		tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec, (int)getpid());
}

void glog_vlog(char level, const char *fmt, va_list ap)
{
	char pfx[96];
	glog_prefix(level, pfx, sizeof(pfx));
	fputs(pfx, stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	fflush(stderr);
}
