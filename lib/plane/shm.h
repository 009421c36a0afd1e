/* The job's names in /dev/shm: the host plane's slots
 * ("dptp-lk-<job hash>-<attempt>-<rank>") and the resources check's segments
 * ("dptp-lk-res-<job hash>-..."). Each is made locked: its owner holds a
 * flock on it from before its name exists until the name is gone, and the
 * lock goes with the owner's process, however it ends. A name whose file
 * nobody holds locked is therefore one whose owner is dead: anyone of the
 * same user may remove it, whichever job it belonged to and whoever
 * launched that job (dptp-run, mpirun, srun, torchrun).
 *
 * The "lk-" says so: dptp-check before 0.1.0's locking made the same names
 * without it ("dptp-<hash>-<attempt>-<rank>", "dptp-res-<hash>-...") and
 * without a lock, so one of its names unlocked may still be in use by a
 * job of that version running alongside. */
#ifndef DPTP_LIB_PLANE_SHM_H
#define DPTP_LIB_PLANE_SHM_H

#include <sys/types.h>

/* Creates name ("/dptp-..."), mode 0600, size bytes, locked (LOCK_EX) before
 * the name appears (an O_TMPFILE linked in once sized and locked; where
 * that is not possible, created, locked and sized in that order). Returns
 * the open descriptor, -EEXIST when the name exists, or -errno. */
int dptp_shm_create_locked(const char *name, off_t size);

/* Removes every name of the two forms above in /dev/shm that is a regular
 * file of this effective user, locked by nobody and either sized or older
 * than a minute (an unsized one may be between its creation and its lock
 * where O_TMPFILE was not available). A name of the older, lock-less forms
 * is removed only when unlocked and unchanged for an hour: that version
 * unlinks its names once the job's ranks have opened them, so one that old
 * is a dead job's. Other users' names are left alone, whatever this user
 * may do. System calls only: the launcher's guard calls it in a forked
 * child. Returns how many names it removed. */
int dptp_shm_sweep(void);

#endif
