/* The job's names in /dev/shm (see shm.h). */
#include "plane/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"
/* An unsized name is young (its owner may be between creating and locking
 * it) for this long; past it, unlocked, its owner died in between. */
#define SHM_YOUNG_S 60
/* A name of the lock-less forms (shm.h) is a live job's for this long. */
#define SHM_LEGACY_S 3600

int dptp_shm_create_locked(const char *name, off_t size)
{
	char path[300], self[64];
	if (name[0] != '/' || strchr(name + 1, '/') || strlen(name) > 255)
		return -EINVAL;
	snprintf(path, sizeof(path), SHM_DIR "%s", name);
	int fd = open(SHM_DIR, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd >= 0) {
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		if (flock(fd, LOCK_EX) == 0 && ftruncate(fd, size) == 0 &&
		    linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0)
			return fd;
		int e = errno;
		close(fd);
		if (e == EEXIST)
			return -EEXIST;
		/* no /proc to link through: the way below */
	}
	/* no O_TMPFILE on this file system or kernel: an unsized, unlocked
	 * name for the moment between these calls */
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX) < 0 || ftruncate(fd, size) < 0) {
		int e = errno;
		shm_unlink(name);
		close(fd);
		return -e;
	}
	return fd;
}

static bool hex16(const char *s)
{
	for (int i = 0; i < 16; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

enum kind { NOT_OURS, LOCKED, LEGACY };

/* "dptp-lk-<16 hex>-<16 hex>-<digits>" or "dptp-lk-res-<16 hex>-<something>";
 * LEGACY: the same without "lk-" */
static enum kind ours(const char *nm)
{
	if (strncmp(nm, "dptp-", 5))
		return NOT_OURS;
	nm += 5;
	enum kind k = strncmp(nm, "lk-", 3) ? LEGACY : LOCKED;
	if (k == LOCKED)
		nm += 3;
	if (!strncmp(nm, "res-", 4))
		return hex16(nm + 4) && nm[20] == '-' && nm[21] ? k : NOT_OURS;
	if (!hex16(nm) || nm[16] != '-' || !hex16(nm + 17) || nm[33] != '-' || !nm[34])
		return NOT_OURS;
	for (nm += 34; *nm; nm++)
		if (*nm < '0' || *nm > '9')
			return NOT_OURS;
	return k;
}

struct dirent64_hdr {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

int dptp_shm_sweep(void)
{
	int dfd = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC), removed = 0;
	char buf[4096];
	long n;
	if (dfd < 0)
		return 0;
	uid_t me = geteuid();
	time_t young = time(NULL) - SHM_YOUNG_S, legacy_young = time(NULL) - SHM_LEGACY_S;
	while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n;) {
			const struct dirent64_hdr *d = (const struct dirent64_hdr *)(buf + off);
			const char *nm = d->d_name;
			struct stat st, now;
			off += d->d_reclen;
			enum kind k = ours(nm);
			if (k == NOT_OURS || fstatat(dfd, nm, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
			    st.st_uid != me || (st.st_size == 0 && st.st_mtime >= young) ||
			    (k == LEGACY && st.st_mtime >= legacy_young))
				continue;
			int fd = openat(dfd, nm, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
			if (fd < 0)
				continue;
			/* unlocked: its owner is gone. The name still the file
			 * we hold (not one made meanwhile): remove it. */
			if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &st) == 0 &&
			    fstatat(dfd, nm, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st.st_ino &&
			    now.st_dev == st.st_dev && unlinkat(dfd, nm, 0) == 0)
				removed++;
			close(fd);
		}
	}
	close(dfd);
	return removed;
}
