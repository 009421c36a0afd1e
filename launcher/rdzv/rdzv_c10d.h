/* The c10d rendezvous with several nodes or MIN:MAX nodes: torch 2.11's
 * DynamicRendezvousHandler over a TCPStore (rdzv_c10d.c); rendezvous.c
 * picks it. */
#ifndef DPTP_LAUNCHER_RDZV_C10D_H
#define DPTP_LAUNCHER_RDZV_C10D_H

#include "rdzv/rdzv_common.h"

/* Makes r a c10d rendezvous (r->opts set). */
int rdzv_c10d_init(struct rendezvous *r, struct dptp_err *err);
/* rendezvous_tick() and rendezvous_heartbeat() (rendezvous.h) of c10d:
 * 0 when r is not one. */
int rdzv_c10d_tick(struct rendezvous *r, struct dptp_err *err);
int rdzv_c10d_heartbeat(struct rendezvous *r, struct dptp_err *err);
/* rendezvous_report_error() of c10d: the round's dptp/failed. */
void rdzv_c10d_report_error(struct rendezvous *r);

#endif
