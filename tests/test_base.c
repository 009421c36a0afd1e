/* lib/base's shared helpers: the growable buffer and this machine's names
 * (one copy each for lib/ and launcher/, issue 26 item 3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/buf.h"
#include "base/host.h"

static void test_buf(void **state)
{
	(void)state;
	struct dptp_buf b = {0};
	dptp_buf_add(&b, NULL, 0);
	assert_int_equal(b.len, 0);
	dptp_buf_adds(&b, "ab");
	dptp_buf_addc(&b, 'c');
	dptp_buf_add(&b, "\0d", 2);
	assert_int_equal(b.len, 5);
	assert_memory_equal(b.buf, "abc\0d", 6); /* the NUL after the bytes */
	/* past the first allocation and past addf's own small buffer */
	char big[1000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	dptp_buf_addf(&b, "[%s|%d]", big, -7);
	assert_int_equal(b.len, 5 + 1 + 999 + 4);
	assert_memory_equal(b.buf + b.len - 4, "|-7]", 5);
	assert_true(b.cap > b.len);
	size_t n = 0;
	char *s = dptp_buf_detach(&b, &n);
	assert_non_null(s);
	assert_int_equal(n, 1009);
	assert_int_equal(strlen(s), 3); /* "abc" then the embedded NUL */
	assert_null(b.buf);
	assert_int_equal(b.len, 0);
	free(s);
	/* an empty buffer detaches as "" */
	s = dptp_buf_detach(&b, &n);
	assert_string_equal(s, "");
	assert_int_equal(n, 0);
	free(s);
	/* after a failed allocation nothing more is appended, and detach says so */
	dptp_buf_adds(&b, "kept");
	b.oom = true;
	dptp_buf_adds(&b, "lost");
	assert_int_equal(b.len, 4);
	assert_false(dptp_buf_reserve(&b, 1));
	assert_null(dptp_buf_detach(&b, NULL));
	assert_null(b.buf);
	assert_false(b.oom);
	dptp_buf_release(&b);
	dptp_buf_release(NULL);
	/* a size no allocation can hold */
	assert_false(dptp_buf_reserve(&b, SIZE_MAX));
	assert_true(b.oom);
	dptp_buf_release(&b);
}

static void test_hostname(void **state)
{
	(void)state;
	char buf[256], sys[256] = "";
	gethostname(sys, sizeof(sys) - 1);
	unsetenv("DPTP_HOSTNAME");
	dptp_hostname(buf, sizeof(buf));
	assert_string_equal(buf, sys);
	setenv("DPTP_HOSTNAME", "", 1);
	dptp_hostname(buf, sizeof(buf));
	assert_string_equal(buf, sys);
	setenv("DPTP_HOSTNAME", "node7", 1);
	dptp_hostname(buf, sizeof(buf));
	assert_string_equal(buf, "node7");
	char small[4];
	dptp_hostname(small, sizeof(small));
	assert_string_equal(small, "nod");
	unsetenv("DPTP_HOSTNAME");
}

/* dptp_getfqdn against Python's socket.getfqdn() where python3 is there */
static void test_getfqdn(void **state)
{
	(void)state;
	char fq[256], py[256] = "";
	dptp_getfqdn(fq, sizeof(fq));
	assert_true(fq[0] != '\0');
	FILE *p = popen("python3 -c 'import socket; print(socket.getfqdn())' 2>/dev/null", "r");
	if (!p)
		skip();
	bool got = fgets(py, sizeof(py), p) != NULL;
	if (pclose(p) != 0 || !got)
		skip();
	py[strcspn(py, "\n")] = '\0';
	assert_string_equal(fq, py);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buf),
		cmocka_unit_test(test_hostname),
		cmocka_unit_test(test_getfqdn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
