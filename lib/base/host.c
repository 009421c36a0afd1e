/* This machine's names (see host.h). */
#include "base/host.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void dptp_hostname(char *buf, size_t len)
{
	const char *h = getenv("DPTP_HOSTNAME");
	if (h && *h) {
		snprintf(buf, len, "%s", h);
		return;
	}
	if (gethostname(buf, len - 1) < 0)
		snprintf(buf, len, "localhost");
	buf[len - 1] = '\0';
}

void dptp_getfqdn(char *buf, size_t len)
{
	char host[256] = "";
	struct addrinfo hints = {.ai_family = AF_UNSPEC}, *res = NULL;
	gethostname(host, sizeof(host) - 1);
	snprintf(buf, len, "%s", host);
	/* CPython's gethostbyaddr(name): the first address getaddrinfo gives */
	if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
		return;
	struct hostent he, *hp = NULL;
	char tmp[8192];
	int herr;
	const void *addr = res->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr
						    : (const void *)&((struct sockaddr_in *)res->ai_addr)->sin_addr;
	socklen_t alen = res->ai_family == AF_INET6 ? sizeof(struct in6_addr) : sizeof(struct in_addr);
	if (gethostbyaddr_r(addr, alen, res->ai_family, &he, tmp, sizeof(tmp), &hp, &herr) == 0 && hp) {
		const char *pick = hp->h_name;
		if (!strchr(pick, '.'))
			for (char **a = hp->h_aliases; a && *a; a++)
				if (strchr(*a, '.')) {
					pick = *a;
					break;
				}
		snprintf(buf, len, "%s", pick);
	}
	freeaddrinfo(res);
}
