/* dptp-run --audit: the sockets, ports and shared-memory segments of one
 * world by name (the shared part of I, C and G): who created each name, who
 * only used it, and whether creates collided. Sorted once: O(n log n); only
 * the names several ranks touched are kept. A
 * create that failed with EADDRINUSE or EEXIST and was followed by a
 * successful create of the same process (the free-port loop) is no
 * collision. */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int cmp_res(const void *a, const void *b, void *arg)
{
	const struct a_res *res = arg, *x = &res[*(const size_t *)a], *y = &res[*(const size_t *)b];
	if (x->key != y->key)
		return (uintptr_t)x->key < (uintptr_t)y->key ? -1 : 1;
	if (x->port != y->port)
		return x->port ? 1 : -1;
	size_t i = *(const size_t *)a, k = *(const size_t *)b;
	return (i > k) - (i < k);
}

static void add_once(int *v, size_t *n, int x)
{
	if (!in_list(v, *n, x))
		v[(*n)++] = x;
}

static int one_name(struct st *s, const size_t *idx, size_t n, struct name_use *u)
{
	const struct job *j = s->j;
	const struct a_res *x = &j->res[idx[0]];
	*u = (struct name_use){.key = x->key, .port = x->port, .unix_name = x->unix_name, .site = "", .usite = "",
		.outer = "", .uouter = ""};
	u->segment = !x->unix_name && !x->port;
	u->owners = malloc((n + 1) * sizeof(int));
	u->users = malloc((n + 1) * sizeof(int));
	if (!u->owners || !u->users)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct a_res *y = &j->res[idx[i]];
		bool creates = y->what == 'b' || y->what == 's';
		if (y->rank < 0)
			continue;
		if (creates && !u->site[0]) {
			u->site = y->site;
			u->outer = y->outer;
		}
		if (!creates && !u->usite[0]) {
			u->usite = y->site;
			u->uouter = y->outer;
		}
		if (creates && y->rc >= 0) {
			add_once(u->owners, &u->no, y->rank);
			u->excl |= y->excl;
		} else if (creates && (y->err == EADDRINUSE || y->err == EEXIST) && !y->recovered) {
			u->ncoll++;
			u->coll_err = y->err;
			add_once(u->owners, &u->no, y->rank);
		} else if (!creates && y->rc >= 0) {
			add_once(u->users, &u->nu, y->rank);
		}
	}
	qsort(u->owners, u->no, sizeof(int), cmp_int);
	for (size_t k = 1; k < u->no; k++)
		u->reps |= replica_of(s->out, u->owners[k]) != replica_of(s->out, u->owners[0]);
	return 0;
}

int names_collect(struct st *s, struct name_use **out, size_t *nout)
{
	const struct job *j = s->j;
	size_t n = 0, cap = 0;
	int rc = 0;
	*out = NULL;
	*nout = 0;
	size_t *idx = malloc((j->nres + 1) * sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	for (size_t i = 0; i < j->nres; i++)
		if (j->res[i].world == s->world)
			idx[n++] = i;
	if (n > 1)
		qsort_r(idx, n, sizeof(*idx), cmp_res, j->res);
	for (size_t i = 0; i < n && rc == 0;) {
		size_t e = i + 1;
		while (e < n && j->res[idx[e]].key == j->res[idx[i]].key && j->res[idx[e]].port == j->res[idx[i]].port)
			e++;
		struct name_use *u = push(out, nout, &cap, sizeof(**out));
		rc = u ? one_name(s, idx + i, e - i, u) : -ENOMEM;
		if (rc == 0 && u->no < 2 && !u->nu) { /* one owner, no user: nothing to say, nothing kept */
			free(u->owners);
			free(u->users);
			(*nout)--;
		}
		i = e;
	}
	free(idx);
	return rc;
}

void names_release(struct name_use *u, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(u[i].owners);
		free(u[i].users);
	}
	free(u);
}
