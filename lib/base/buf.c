/* A growable byte buffer (see buf.h). */
#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool dptp_buf_reserve(struct dptp_buf *b, size_t n)
{
	if (b->oom)
		return false;
	if (n >= SIZE_MAX - b->len) {
		b->oom = true;
		return false;
	}
	size_t need = b->len + n + 1;
	if (need <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	uint8_t *nb = realloc(b->buf, cap);
	if (!nb) {
		b->oom = true;
		return false;
	}
	b->buf = nb;
	b->cap = cap;
	return true;
}

void dptp_buf_add(struct dptp_buf *b, const void *p, size_t n)
{
	if (!dptp_buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->buf + b->len, p, n);
	b->len += n;
	b->buf[b->len] = '\0';
}

void dptp_buf_addc(struct dptp_buf *b, char c)
{
	dptp_buf_add(b, &c, 1);
}

void dptp_buf_adds(struct dptp_buf *b, const char *s)
{
	dptp_buf_add(b, s, strlen(s));
}

void dptp_buf_addf(struct dptp_buf *b, const char *fmt, ...)
{
	va_list ap;
	char small[128];
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->oom = true;
		return;
	}
	if ((size_t)n < sizeof(small)) {
		dptp_buf_add(b, small, (size_t)n);
		return;
	}
	if (!dptp_buf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf((char *)b->buf + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

char *dptp_buf_detach(struct dptp_buf *b, size_t *len)
{
	char *s = NULL;
	if (!b->oom && dptp_buf_reserve(b, 0)) {
		b->buf[b->len] = '\0';
		s = (char *)b->buf;
		if (len)
			*len = b->len;
		b->buf = NULL;
	}
	dptp_buf_release(b);
	return s;
}

void dptp_buf_release(struct dptp_buf *b)
{
	if (!b)
		return;
	free(b->buf);
	*b = (struct dptp_buf){0};
}
