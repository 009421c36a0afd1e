/* This machine's names: the one a node goes by in a job, and Python's
 * socket.getfqdn(), which torch puts in its reports, its events and a c10d
 * node's address. */
#ifndef DPTP_BASE_HOST_H
#define DPTP_BASE_HOST_H

#include <stddef.h>

/* The name this process goes by in the job: DPTP_HOSTNAME when set (tests
 * that lay several "hosts" over one machine; ranks and nodes with equal
 * names share memory), else gethostname(), else "localhost". */
void dptp_hostname(char *buf, size_t len);
/* Python's socket.getfqdn(): the host name's first address (getaddrinfo)
 * looked up back (gethostbyaddr); of that name and its aliases the first
 * with a dot, else the name; the host name itself when a lookup fails. */
void dptp_getfqdn(char *buf, size_t len);

#endif
