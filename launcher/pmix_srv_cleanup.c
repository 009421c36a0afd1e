/* PMIx cleanup directives (see pmix_srv_cleanup.h). */
#include "pmix_srv_cleanup.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct cleanup_item {
	struct cleanup_item *next;
	unsigned flags;
	char *ignore; /* ",a,b," or NULL */
	char path[];
};

static bool path_ok(const char *p)
{
	size_t n = strlen(p);
	if (p[0] != '/' || n < 2 || strstr(p, "/../") || (n >= 3 && !strcmp(p + n - 3, "/..")))
		return false;
	return true;
}

int cleanup_add(struct cleanup_item **list, const char *paths, unsigned flags, const char *ignore)
{
	char *copy = strdup(paths ? paths : ""), *save = NULL;
	int refused = 0;
	if (!copy)
		return -1;
	for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
		struct cleanup_item *c;
		if (!path_ok(p)) {
			refused++;
			continue;
		}
		c = calloc(1, sizeof(*c) + strlen(p) + 1);
		if (!c || (ignore && *ignore && asprintf(&c->ignore, ",%s,", ignore) < 0)) {
			free(c);
			free(copy);
			return -1;
		}
		strcpy(c->path, p);
		c->flags = flags;
		c->next = *list;
		*list = c;
	}
	free(copy);
	return refused;
}

static bool ignored(const struct cleanup_item *c, const char *name)
{
	char key[300];
	if (!c->ignore)
		return false;
	snprintf(key, sizeof(key), ",%s,", name);
	return strstr(c->ignore, key) != NULL;
}

/* Empties dir as the item's flags say; returns true when it is empty now. */
static bool clean_dir(const struct cleanup_item *c, const char *dir, int depth)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool empty = true;
	if (!d)
		return false;
	while ((e = readdir(d))) {
		char sub[4096];
		struct stat st;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
		if (ignored(c, e->d_name) || lstat(sub, &st) < 0) {
			empty = false;
			continue;
		}
		if (S_ISDIR(st.st_mode)) {
			if (!(c->flags & (CLEANUP_RECURSIVE | CLEANUP_EMPTY)) || depth > 64 || !clean_dir(c, sub, depth + 1) ||
			    rmdir(sub) < 0)
				empty = false;
		} else if ((c->flags & CLEANUP_EMPTY) || unlink(sub) < 0) {
			empty = false;
		}
	}
	closedir(d);
	return empty;
}

void cleanup_run(struct cleanup_item **list)
{
	while (*list) {
		struct cleanup_item *c = *list;
		struct stat st;
		*list = c->next;
		if (lstat(c->path, &st) == 0) {
			if (!(c->flags & CLEANUP_DIR)) {
				if (!S_ISDIR(st.st_mode))
					unlink(c->path);
			} else if (S_ISDIR(st.st_mode) && clean_dir(c, c->path, 0) && !(c->flags & CLEANUP_LEAVE_TOP)) {
				rmdir(c->path);
			}
		}
		free(c->ignore);
		free(c);
	}
}
