/* dptp-run --audit, mechanism I: one socket name or shared-memory segment
 * created by several ranks (a name that should be unique lacks the group,
 * replica or instance part), and one port bound by ranks of one replica.
 * Ports bound across replicas are C (c.c). */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdio.h>

/* Do the creates of this name collide? A segment every member opens with
 * O_CREAT is shared, not taken: only replicas meeting on it, or EEXIST,
 * tell. */
bool name_collides(const struct name_use *u)
{
	return u->no > 1 && (!u->segment || u->reps || u->ncoll);
}

const char *collision_how(const struct name_use *u)
{
	if (u->ncoll)
		return u->coll_err == EADDRINUSE ? "the later ones failed with EADDRINUSE (\"[Errno 98] Address already in use\")"
						 : "the later ones failed with EEXIST (\"[Errno 17] File exists\")";
	return u->segment && !u->excl ? "they opened one segment between them"
				      : "every one succeeded, serialised in time: a reordering makes it fail";
}

int find_i(struct st *s, const struct name_use *u, size_t n)
{
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (!name_collides(&u[i]) || (u[i].port && u[i].reps))
			continue;
		char o[256], from[200];
		fmt_ranks(o, sizeof(o), u[i].owners, u[i].no);
		called_from(from, sizeof(from), u[i].site, u[i].outer);
		const char *what = u[i].port ? "port" : u[i].segment ? "shared-memory segment" : "socket name";
		const char *q = u[i].port ? "" : "'";
		rc = add_finding(s, 'I', u[i].owners, u[i].no, u[i].site, u[i].segment ? "shm_open" : "bind",
			"%s %s%s%s taken by ranks %s%s%s: %s; a name that should be unique lacks the group, replica or instance part (or comes from an identically seeded RNG)",
			what, q, u[i].port ? u[i].key + 5 : u[i].key, q, o, u[i].reps ? " of different replicas" : "", from,
			collision_how(&u[i]));
	}
	return rc;
}
