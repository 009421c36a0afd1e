/* Worker logs (see logs.h). */
#include "output/logs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* tempfile.mkdtemp: prefix + 8 characters of Python's alphabet */
static char *mkdtemp_py(const char *dir, const char *prefix)
{
	static const char alpha[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
	for (int attempt = 0; attempt < 100; attempt++) {
		unsigned char r[8];
		char name[8 + 1];
		char *path;
		dptp_entropy(r, sizeof(r));
		for (int i = 0; i < 8; i++)
			name[i] = alpha[r[i] % (sizeof(alpha) - 1)];
		name[8] = '\0';
		if (asprintf(&path, "%s/%s%s", dir, prefix, name) < 0)
			return NULL;
		if (mkdir(path, 0700) == 0)
			return path;
		free(path);
		if (errno != EEXIST)
			return NULL;
	}
	errno = EEXIST;
	return NULL;
}

static int mkdir_p(const char *path)
{
	char buf[4096];
	size_t len = strlen(path);
	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *c = buf + 1; *c; c++) {
		if (*c != '/')
			continue;
		*c = '\0';
		if (mkdir(buf, 0777) < 0 && errno != EEXIST)
			return -errno;
		*c = '/';
	}
	if (mkdir(buf, 0777) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int logs_dirs_init(struct logs_dirs *d, const char *log_dir, const char *run_id, struct dptp_err *err)
{
	struct stat st;
	char prefix[128];
	const char *base = log_dir;
	memset(d, 0, sizeof(*d));
	if (log_dir && !strcmp(log_dir, "/dev/null")) {
		d->devnull = true;
		return 0;
	}
	if (!log_dir) {
		const char *tmp = getenv("TMPDIR");
		if (!tmp || !*tmp)
			tmp = "/tmp";
		d->base_created = mkdtemp_py(tmp, "torchelastic_");
		if (!d->base_created)
			return dptp_err_set(err, -errno, "cannot create a log directory in '%s': %s", tmp, strerror(errno));
		base = d->base_created;
	} else if (stat(log_dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
		return dptp_err_set(err, -ENOTDIR, "log_dir: %s is a file", log_dir);
	} else {
		int rc = mkdir_p(log_dir);
		if (rc < 0)
			return dptp_err_set(err, rc, "cannot create log_dir '%s': %s", log_dir, strerror(-rc));
	}
	snprintf(prefix, sizeof(prefix), "%s_", run_id);
	d->run_dir = mkdtemp_py(base, prefix);
	if (!d->run_dir)
		return dptp_err_set(err, -errno, "cannot create a run directory in '%s': %s", base, strerror(errno));
	return 0;
}

int logs_dirs_attempt(struct logs_dirs *d, unsigned attempt, unsigned nlocal, char **out, struct dptp_err *err)
{
	char *dir;
	*out = NULL;
	if (d->devnull)
		return 0;
	if (asprintf(&dir, "%s/attempt_%u", d->run_dir, attempt) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	dptp_rm_tree(dir); /* shutil.rmtree(ignore_errors) */
	if (mkdir(dir, 0777) < 0)
		goto fail;
	for (unsigned i = 0; i < nlocal; i++) {
		char sub[4200];
		snprintf(sub, sizeof(sub), "%s/%u", dir, i);
		if (mkdir(sub, 0777) < 0)
			goto fail;
	}
	*out = dir;
	return 0;
fail:
	{
		int e = errno;
		dptp_err_set(err, -e, "cannot create '%s/...': %s", dir, strerror(e));
		free(dir);
		return -e;
	}
}

/* Removes a directory once the walk has left it, when it is empty: what
 * holds a file (a log, an error file) stays with its parents. */
static int rm_empty_dir(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	if (flag == FTW_DP)
		rmdir(path);
	return 0;
}

void logs_dirs_release(struct logs_dirs *d)
{
	if (!d)
		return;
	if (d->base_created) /* one walk: the empty directories go */
		nftw(d->base_created, rm_empty_dir, 16, FTW_DEPTH | FTW_PHYS);
	free(d->base_created);
	free(d->run_dir);
	memset(d, 0, sizeof(*d));
}

int logs_filters_parse(const char *spec, struct logs_filters *f)
{
	memset(f, 0, sizeof(*f));
	if (!spec)
		return 0;
	size_t cap = 1;
	for (const char *c = spec; *c; c++)
		cap += *c == ',';
	f->needle = calloc(cap, sizeof(*f->needle));
	if (!f->needle)
		return -ENOMEM;
	for (const char *c = spec;;) {
		/* one item: up to a comma that is not part of ",," */
		char *item = malloc(strlen(c) + 1), *o = item;
		if (!item) {
			logs_filters_release(f);
			return -ENOMEM;
		}
		while (*c && !(*c == ',' && c[1] != ',')) {
			if (*c == ',') /* ",," */
				c++;
			*o++ = *c++;
		}
		*o = '\0';
		f->needle[f->n++] = item;
		if (!*c)
			return 0;
		c++;
	}
}

bool logs_filters_match(const struct logs_filters *f, const char *line, size_t len)
{
	for (size_t i = 0; i < f->n; i++)
		if (!f->needle[i][0] || memmem(line, len, f->needle[i], strlen(f->needle[i])))
			return true;
	return false;
}

void logs_filters_release(struct logs_filters *f)
{
	for (size_t i = 0; f && i < f->n; i++)
		free(f->needle[i]);
	if (f)
		free(f->needle);
	if (f)
		memset(f, 0, sizeof(*f));
}

void logs_stream_init(struct logs_stream *ls)
{
	memset(ls, 0, sizeof(*ls));
	ls->fd = ls->file_fd = ls->console_fd = ls->dup_fd = -1;
}

void logs_stream_duplicate(struct logs_stream *ls, int fd, const struct logs_filters *f)
{
	ls->dup_fd = f && f->n ? fd : -1;
	ls->dup = f;
}

int logs_stream_open(struct logs_stream *ls, int fd, int file_fd, int console_fd, char *prefix)
{
	ls->fd = fd;
	ls->file_fd = file_fd;
	ls->console_fd = console_fd;
	ls->prefix = prefix;
	ls->prefix_len = prefix ? strlen(prefix) : 0;
	ls->cap = 1 << 16;
	ls->buf = malloc(ls->cap);
	return ls->buf ? 0 : -ENOMEM;
}

static void write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return; /* console gone: drop, as a closed terminal would */
		}
		p += w;
		n -= (size_t)w;
	}
}

/* One writev of whole lines; a short write (a full pipe) is finished in
 * order. */
static void write_lines(int fd, const struct iovec *iov, size_t niov)
{
	size_t total = 0;
	for (size_t i = 0; i < niov; i++)
		total += iov[i].iov_len;
	ssize_t w;
	do
		w = writev(fd, iov, (int)niov);
	while (w < 0 && errno == EINTR);
	if (w < 0 || (size_t)w >= total)
		return;
	size_t skip = (size_t)w;
	for (size_t i = 0; i < niov; i++) {
		if (skip >= iov[i].iov_len) {
			skip -= iov[i].iov_len;
			continue;
		}
		write_all(fd, (const char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
		skip = 0;
	}
}

/* Writes complete lines of buf[0..len) with prefixes, in one writev per
 * batch; a line longer than the buffer is emitted when the buffer is full. */
static void emit_lines(struct logs_stream *ls, bool final)
{
	struct iovec iov[128];
	size_t start = 0, niov = 0;
	if (ls->console_fd < 0) {
		ls->len = 0;
		return;
	}
	for (;;) {
		char *nl = memchr(ls->buf + start, '\n', ls->len - start);
		size_t end;
		if (nl)
			end = (size_t)(nl - ls->buf) + 1;
		else if ((final && start < ls->len) || (ls->len == ls->cap && start == 0))
			end = ls->len;
		else
			break;
		iov[niov++] = (struct iovec){ls->prefix, ls->prefix_len};
		iov[niov++] = (struct iovec){ls->buf + start, end - start};
		if (!nl)
			iov[niov++] = (struct iovec){"\n", 1};
		if (ls->dup_fd >= 0 && logs_filters_match(ls->dup, ls->buf + start, end - start))
			write_lines(ls->dup_fd, iov + niov - (nl ? 2 : 3), nl ? 2 : 3);
		start = end;
		if (niov + 3 > DPTP_ARRAY_LEN(iov)) {
			size_t total = 0;
			for (size_t i = 0; i < niov; i++)
				total += iov[i].iov_len;
			char *flat = malloc(total);
			if (flat) {
				size_t off = 0;
				for (size_t i = 0; i < niov; i++) {
					memcpy(flat + off, iov[i].iov_base, iov[i].iov_len);
					off += iov[i].iov_len;
				}
				write_all(ls->console_fd, flat, total);
				free(flat);
			}
			niov = 0;
		}
	}
	if (niov)
		write_lines(ls->console_fd, iov, niov);
	memmove(ls->buf, ls->buf + start, ls->len - start);
	ls->len -= start;
}

int logs_stream_pump(struct logs_stream *ls)
{
	if (ls->fd < 0)
		return 1;
	for (;;) {
		ssize_t n = read(ls->fd, ls->buf + ls->len, ls->cap - ls->len);
		if (n > 0) {
			if (ls->file_fd >= 0)
				write_all(ls->file_fd, ls->buf + ls->len, (size_t)n);
			ls->len += (size_t)n;
			emit_lines(ls, false);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 0;
		logs_stream_release(ls);
		return 1;
	}
}

void logs_stream_release(struct logs_stream *ls)
{
	if (!ls)
		return;
	if (ls->buf && ls->len)
		emit_lines(ls, true);
	if (ls->fd >= 0)
		close(ls->fd);
	if (ls->file_fd >= 0)
		close(ls->file_fd);
	free(ls->prefix);
	free(ls->buf);
	logs_stream_init(ls);
}
