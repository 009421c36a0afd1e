/* Reports written to files atomically (see report.h). */
#include "report/report.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The mode a new file would get: 0666 less the umask, read without
 * changing it (umask(2) would race with other threads). */
static mode_t new_file_mode(void)
{
	mode_t mask = 022;
	FILE *st = fopen("/proc/self/status", "re");
	if (st) {
		char line[256];
		while (fgets(line, sizeof(line), st)) {
			unsigned m;
			if (sscanf(line, "Umask: %o", &m) == 1) {
				mask = (mode_t)m;
				break;
			}
		}
		fclose(st);
	}
	return 0666 & ~mask;
}

/* A target written in place, not replaced: an existing file that is not a
 * regular one (character device, FIFO, socket), or a descriptor named by
 * path (/dev/fd/N, /proc/self/fd/N, /dev/stdout, /dev/stderr). */
static bool in_place(const char *path)
{
	static const char *const fdpaths[] = { "/dev/fd/", "/proc/self/fd/", "/dev/stdout", "/dev/stderr" };
	for (size_t i = 0; i < sizeof(fdpaths) / sizeof(fdpaths[0]); i++)
		if (strncmp(path, fdpaths[i], strlen(fdpaths[i])) == 0)
			return true;
	struct stat st;
	return stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

/* Opens an in-place target for writing; a FIFO without a reader is waited
 * for at most 10 s (opened non-blocking, then made blocking to write). */
static int open_in_place(const char *path, struct dptp_err *err)
{
	double end = dptp_now() + 10;
	for (;;) {
		int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd >= 0) {
			struct stat st;
			if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(fd, 0) < 0) {
				int e = errno;
				close(fd);
				return dptp_err_set(err, -e, "cannot write report '%s': truncate: %s", path, strerror(e));
			}
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
			return fd;
		}
		if (errno != ENXIO || dptp_now() > end)
			return dptp_err_set(err, -errno, "cannot write report '%s': %s%s", path, strerror(errno),
					    errno == ENXIO ? " (a FIFO nobody read for 10 s)" : "");
		struct timespec ts = { 0, 20000000 };
		nanosleep(&ts, NULL);
	}
}

static int write_in_place(int (*emit)(void *arg, FILE *f), void *arg, const char *path,
			  struct dptp_err *err)
{
	int fd = open_in_place(path, err);
	if (fd < 0)
		return fd;
	FILE *f = fdopen(fd, "w");
	if (!f) {
		int e = errno;
		close(fd);
		return dptp_err_set(err, -e, "cannot write report '%s': %s", path, strerror(e));
	}
	errno = 0;
	int rc = emit(arg, f);
	if (rc == -EINVAL) {
		fclose(f);
		return dptp_err_set(err, rc, "cannot write report '%s': unknown format", path);
	}
	if (rc < 0 || fflush(f) != 0 || ferror(f))
		rc = -(errno ? errno : EIO);
	if (fclose(f) != 0 && rc == 0)
		rc = -errno;
	return rc < 0 ? dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc)) : 0;
}

struct report_emit {
	const struct dptp_report *r;
	enum dptp_format fmt;
};

static int emit_report(void *arg, FILE *f)
{
	const struct report_emit *e = arg;
	return dptp_report_write(e->r, e->fmt, f, false, 0);
}

int dptp_report_write_file(const struct dptp_report *r, enum dptp_format fmt,
			   const char *path, struct dptp_err *err)
{
	struct report_emit e = { r, fmt };
	return dptp_write_file_with(path, emit_report, &e, err);
}

int dptp_write_file_with(const char *path, int (*emit)(void *arg, FILE *f), void *arg,
			 struct dptp_err *err)
{
	if (!path || !*path)
		return dptp_err_set(err, -EINVAL, "cannot write the report: empty file name");
	if (in_place(path))
		return write_in_place(emit, arg, path, err);
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	if (!*base)
		return dptp_err_set(err, -EISDIR, "cannot write report '%s': names a directory", path);
	size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	/* the temporary sibling is ".<name>.tmpXXXXXX", or a fixed short name
	 * when that would pass NAME_MAX */
	if (strlen(base) + sizeof("..tmpXXXXXX") > NAME_MAX)
		base = "dptp-report";
	size_t tlen = dirlen + 1 + strlen(base) + sizeof(".tmpXXXXXX");
	char *tmp = malloc(tlen);
	if (!tmp)
		return dptp_err_set(err, -ENOMEM, "cannot write report '%s': out of memory", path);
	snprintf(tmp, tlen, "%.*s.%s.tmpXXXXXX", (int)dirlen, path, base);

	int rc = 0;
	FILE *f = NULL;
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot create a temporary file for report '%s': %s",
			     path, strerror(-rc));
		free(tmp);
		return rc;
	}
	struct stat old;
	mode_t mode = stat(path, &old) == 0 ? (old.st_mode & 07777) : new_file_mode();
	if (fchmod(fd, mode) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': chmod: %s", path, strerror(-rc));
		close(fd);
		goto fail;
	}
	f = fdopen(fd, "w");
	if (!f) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		close(fd);
		goto fail;
	}
	errno = 0;
	rc = emit(arg, f);
	if (rc == -EINVAL) {
		dptp_err_set(err, rc, "cannot write report '%s': unknown format", path);
		fclose(f);
		goto fail;
	}
	if (rc < 0 || fflush(f) != 0 || ferror(f)) {
		rc = -(errno ? errno : EIO);
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		fclose(f);
		goto fail;
	}
	if (fsync(fileno(f)) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': fsync: %s", path, strerror(-rc));
		fclose(f);
		goto fail;
	}
	if (fclose(f) != 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': %s", path, strerror(-rc));
		goto fail;
	}
	if (rename(tmp, path) < 0) {
		rc = -errno;
		dptp_err_set(err, rc, "cannot write report '%s': rename: %s", path, strerror(-rc));
		goto fail;
	}
	/* Make the rename itself durable; a failure here loses nothing. */
	char *dir = strndup(path, dirlen ? dirlen : 0);
	int dfd = open(dirlen ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	free(dir);
	free(tmp);
	return 0;
fail:
	unlink(tmp);
	free(tmp);
	return rc;
}
