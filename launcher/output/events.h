/* --event-log-handler: torchrun 2.11's agent events
 * (torch/distributed/elastic/events, agent/server/api.py, launcher/api.py).
 * With the console handler each event is one line of JSON on stderr, the
 * form of torch's Event.serialize():
 *   {"name": "torchelastic.worker.status.<STATE>", "source": "AGENT"|"WORKER",
 *    "timestamp": 0, "metadata": {"run_id": ..., "global_rank": ...,
 *    "group_rank": ..., "worker_id": ..., "role": ..., "hostname": ...,
 *    "state": ..., "total_run_time": ..., "rdzv_backend": ...,
 *    "raw_error": ..., "metadata": "<JSON text>", "agent_restarts": ...,
 *    "duration_ms": ...}}
 * The events: RENDEZVOUS and ASSIGN_WORKER_RANKS (agent, with their
 * duration) for every rendezvous, START for each worker started, at the end
 * SUCCEEDED / FAILED / TERMINATED for each worker of the last attempt and
 * SUCCEEDED for the agent (torch records it whenever its run returns, also
 * when the workers failed), or FAILED for the agent when the run ends by an
 * error or a signal. The handlers null and dynamic_rendezvous print
 * nothing; LOGLEVEL above INFO silences the console handler, as it does
 * torch's events logger. */
#ifndef DPTP_LAUNCHER_EVENTS_H
#define DPTP_LAUNCHER_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

struct failure;

struct agent_events {
	int fd;                 /* -1: events are not printed */
	const char *run_id, *role, *backend;
	char *entry_point;
	char hostname[256];
	unsigned max_restarts;
	double start;           /* monotonic start of the run */
	long total_run_time;    /* whole seconds, set when the run ends */
	bool have_group;        /* a rendezvous has completed */
	unsigned group_rank, group_world_size;
	/* torch's shared {"message": "<NONE>"} gains errorTraits with the first
	 * failure of a nonnegative exit code without an error file, and every
	 * failure without a file shows it from then on */
	bool none_has_traits;
};

/* A worker as the events describe it. */
struct event_worker {
	unsigned local_rank, global_rank, role_rank, role_world_size;
	pid_t pid;                   /* worker_id */
	const struct failure *fail;  /* NULL: not among the failures */
};

/* handler: the option's value. Returns 0, or -1 for a name torch has no
 * handler for (the caller reports it). fd: where the console writes. */
int events_init(struct agent_events *e, const char *handler, int fd);
void events_release(struct agent_events *e);

/* An agent event; duration_ms < 0: null; raw_error NULL: null. */
void events_agent(struct agent_events *e, const char *state, unsigned restarts, double duration_ms,
	const char *raw_error);
/* A worker event: START (no failure fields) or the end state. */
void events_worker(struct agent_events *e, const char *state, unsigned restarts, const struct event_worker *w);
/* Notes a failure as torch's ProcessFailure does (see none_has_traits). */
void events_note_failure(struct agent_events *e, const struct failure *f);

/* Python's json.dumps of a JSON text (", " and ": " separators, ASCII
 * only, floats in repr form); NULL when text is not JSON. malloc'd. */
char *events_json_redump(const char *text);
/* Python's repr() of a float into buf. */
void events_float_repr(double v, char *buf, size_t len);

#endif
