/* TCPStore request frames (see tcpstore.h). */
#include "wire/tcpstore.h"

#include <stdlib.h>
#include <string.h>

void dptp_tcpstore_frame_u8(struct dptp_buf *f, uint8_t v)
{
	dptp_buf_add(f, &v, 1);
}

void dptp_tcpstore_frame_u32(struct dptp_buf *f, uint32_t v)
{
	uint8_t b[4];
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	dptp_buf_add(f, b, 4);
}

void dptp_tcpstore_frame_u64(struct dptp_buf *f, uint64_t v)
{
	uint8_t b[8];
	dptp_le64_put(b, v);
	dptp_buf_add(f, b, 8);
}

void dptp_tcpstore_frame_str(struct dptp_buf *f, const void *p, size_t n)
{
	dptp_tcpstore_frame_u64(f, n);
	dptp_buf_add(f, p, n);
}

void dptp_tcpstore_frame_handshake(struct dptp_buf *f, uint32_t nonce)
{
	dptp_tcpstore_frame_u8(f, DPTP_TCPSTORE_VALIDATE);
	dptp_tcpstore_frame_u32(f, DPTP_TCPSTORE_MAGIC);
	dptp_tcpstore_frame_u8(f, DPTP_TCPSTORE_PING);
	dptp_tcpstore_frame_u32(f, nonce);
}

void dptp_tcpstore_frame_set(struct dptp_buf *f, const char *key, const void *v, size_t n)
{
	dptp_tcpstore_frame_u8(f, DPTP_TCPSTORE_SET);
	dptp_tcpstore_frame_str(f, key, strlen(key));
	dptp_tcpstore_frame_str(f, v, n);
}

void dptp_tcpstore_frame_wait(struct dptp_buf *f, const char *key)
{
	dptp_tcpstore_frame_u8(f, DPTP_TCPSTORE_WAIT);
	dptp_tcpstore_frame_u64(f, 1);
	dptp_tcpstore_frame_str(f, key, strlen(key));
}
