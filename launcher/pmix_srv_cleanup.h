/* Files and directories that a job's PMIx clients registered for removal
 * with PMIx_Job_control (PMIX_REGISTER_CLEANUP, PMIX_REGISTER_CLEANUP_DIR):
 * Open MPI registers its shared-memory segments this way. The launcher
 * removes them when the job ends, normally or not. */
#ifndef DPTP_LAUNCHER_PMIX_SRV_CLEANUP_H
#define DPTP_LAUNCHER_PMIX_SRV_CLEANUP_H

#include <stdbool.h>

struct cleanup_item;

enum cleanup_flags {
	CLEANUP_DIR = 1,        /* the paths are directories */
	CLEANUP_RECURSIVE = 2,  /* PMIX_CLEANUP_RECURSIVE: subdirectories too */
	CLEANUP_EMPTY = 4,      /* PMIX_CLEANUP_EMPTY: only empty subdirectories */
	CLEANUP_LEAVE_TOP = 8,  /* PMIX_CLEANUP_LEAVE_TOPDIR */
};

/* Adds every path of the comma-separated list (absolute, no "..": others
 * are refused). ignore: comma-separated file names kept, or NULL.
 * Returns the number of paths refused, -1 when out of memory. */
int cleanup_add(struct cleanup_item **list, const char *paths, unsigned flags, const char *ignore);
/* Removes what the list names (what the launcher's uid may remove) and
 * empties the list. */
void cleanup_run(struct cleanup_item **list);

#endif
