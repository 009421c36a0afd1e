/* This machine's names as torch sees them. */
#ifndef DPTP_LAUNCHER_HOST_H
#define DPTP_LAUNCHER_HOST_H

#include <stddef.h>

/* Python's socket.getfqdn() (torch's report "host :" line, its events, a
 * c10d node's address and a rank-0 agent's MASTER_ADDR): the host name's
 * first address looked up back; of that name and its aliases the first
 * with a dot, else the name; the host name itself when a lookup fails. */
void host_fqdn(char *buf, size_t len);

#endif
