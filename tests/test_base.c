/* lib/base's shared helpers: the growable buffer, this machine's names
 * (one copy each for lib/ and launcher/, issue 26 item 3), and json.dumps
 * strings byte for byte against Python's. */
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
#include "base/json.h"
#include "base/utf8.h"

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

/* Bytes, then json.dumps(b.decode("utf-8", "surrogateescape")) and
 * json.dumps(b.decode("utf-8", "replace")), as python3 printed them. */
static const struct {
	const char *in;
	size_t n;
	const char *escape, *replace;
} dumps[] = {
	{"", 0, "\"\"", "\"\""},
	{"\x70\x6c\x61\x69\x6e", 5, "\"plain\"", "\"plain\""},
	{"\x71\x22\x62\x5c\x73\x2f", 6, "\"q\\\"b\\\\s/\"", "\"q\\\"b\\\\s/\""},
	{"\x0a\x0d\x09\x08\x0c", 5, "\"\\n\\r\\t\\b\\f\"", "\"\\n\\r\\t\\b\\f\""},
	{"\x00\x01\x1f", 3, "\"\\u0000\\u0001\\u001f\"", "\"\\u0000\\u0001\\u001f\""},
	{"\x7e\x7f", 2, "\"~\\u007f\"", "\"~\\u007f\""},
	{"\x63\x61\x66\xc3\xa9", 5, "\"caf\\u00e9\"", "\"caf\\u00e9\""},
	{"\xe2\x82\xac\x20\xe2\x80\xa8", 7, "\"\\u20ac \\u2028\"", "\"\\u20ac \\u2028\""},
	{"\xf0\x9f\x98\x80", 4, "\"\\ud83d\\ude00\"", "\"\\ud83d\\ude00\""},
	{"\xf4\x8f\xbf\xbf", 4, "\"\\udbff\\udfff\"", "\"\\udbff\\udfff\""},
	{"\xff", 1, "\"\\udcff\"", "\"\\ufffd\""},
	{"\x80\x78", 2, "\"\\udc80x\"", "\"\\ufffdx\""},
	{"\xc0\xaf", 2, "\"\\udcc0\\udcaf\"", "\"\\ufffd\\ufffd\""},
	{"\xc3", 1, "\"\\udcc3\"", "\"\\ufffd\""},
	{"\xe2\x82", 2, "\"\\udce2\\udc82\"", "\"\\ufffd\""},
	{"\xe2\x82\x41", 3, "\"\\udce2\\udc82A\"", "\"\\ufffdA\""},
	{"\xed\xa0\x80", 3, "\"\\udced\\udca0\\udc80\"", "\"\\ufffd\\ufffd\\ufffd\""},
	{"\xed\xbf\xbf", 3, "\"\\udced\\udcbf\\udcbf\"", "\"\\ufffd\\ufffd\\ufffd\""},
	{"\xf4\x90\x80\x80", 4, "\"\\udcf4\\udc90\\udc80\\udc80\"", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""},
	{"\xf0\x9f\x98", 3, "\"\\udcf0\\udc9f\\udc98\"", "\"\\ufffd\""},
	{"\xf8\x88\x80\x80\x80", 5, "\"\\udcf8\\udc88\\udc80\\udc80\\udc80\"", "\"\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\""},
	{"\x61\xef\xbf\xbd\x62", 5, "\"a\\ufffdb\"", "\"a\\ufffdb\""},
	{"\xe0\x80\x80", 3, "\"\\udce0\\udc80\\udc80\"", "\"\\ufffd\\ufffd\\ufffd\""},
	{"\xef\xbf\xbe", 3, "\"\\ufffe\"", "\"\\ufffe\""},
};

static void test_json_str(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(dumps) / sizeof(dumps[0]); i++) {
		struct dptp_buf b = {0};
		dptp_json_str(&b, dumps[i].in, dumps[i].n, 0);
		assert_false(b.oom);
		assert_string_equal((char *)b.buf, dumps[i].escape);
		dptp_buf_release(&b);
		dptp_json_str(&b, dumps[i].in, dumps[i].n, DPTP_JSON_REPLACE);
		assert_string_equal((char *)b.buf, dumps[i].replace);
		dptp_buf_release(&b);
	}
}

/* Code points as json.dumps(chr(cp)) writes them (without the quotes). */
static void test_json_cp(void **state)
{
	(void)state;
	static const struct { uint32_t cp; const char *out; } cps[] = {
		{'"', "\\\""}, {'/', "/"}, {0x7f, "\\u007f"}, {0xab, "\\u00ab"}, {0xd800, "\\ud800"},
		{0xdfff, "\\udfff"}, {0xfeff, "\\ufeff"}, {0x10000, "\\ud800\\udc00"}, {0x10ffff, "\\udbff\\udfff"},
	};
	for (size_t i = 0; i < sizeof(cps) / sizeof(cps[0]); i++) {
		struct dptp_buf b = {0};
		dptp_json_cp(&b, cps[i].cp);
		assert_string_equal((char *)b.buf, cps[i].out);
		dptp_buf_release(&b);
	}
}

/* The piece Python's decoder reports as one error. */
static void test_utf8_invalid_len(void **state)
{
	(void)state;
	static const struct { const char *in; size_t n, len; } bad[] = {
		{"\xff", 1, 1}, {"\x80", 1, 1}, {"\xc0\xaf", 2, 1}, {"\xc3", 1, 1}, {"\xe2\x82", 2, 2},
		{"\xe2\x82" "A", 3, 2}, {"\xe0\x80", 2, 1}, {"\xed\xa0\x80", 3, 1}, {"\xf0\x9f\x98", 3, 3},
		{"\xf4\x90", 2, 1}, {"\xf5\x80", 2, 1},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint32_t cp;
		assert_int_equal(dptp_utf8_next((const uint8_t *)bad[i].in, bad[i].n, 0, &cp), 0);
		assert_int_equal(dptp_utf8_invalid_len((const uint8_t *)bad[i].in, bad[i].n), bad[i].len);
	}
}

/* JSON texts, then json.loads(t, strict=False) encoded as UTF-8 with each
 * lone surrogate as U+FFFD, and with errors="surrogatepass"; NULL where
 * json.loads raises. */
static const struct {
	const char *in, *fffd;
	size_t nfffd;
	const char *pass;
	size_t npass;
} loads[] = {
	{"\x22\x22", "", 0, "", 0},
	{"\x22\x70\x6c\x61\x69\x6e\x22", "\x70\x6c\x61\x69\x6e", 5, "\x70\x6c\x61\x69\x6e", 5},
	{"\x22\x71\x5c\x22\x62\x5c\x5c\x73\x5c\x2f\x22", "\x71\x22\x62\x5c\x73\x2f", 6, "\x71\x22\x62\x5c\x73\x2f", 6},
	{"\x22\x5c\x62\x5c\x66\x5c\x6e\x5c\x72\x5c\x74\x22", "\x08\x0c\x0a\x0d\x09", 5, "\x08\x0c\x0a\x0d\x09", 5},
	{"\x22\x5c\x75\x30\x30\x65\x39\x5c\x75\x30\x30\x45\x39\x22", "\xc3\xa9\xc3\xa9", 4, "\xc3\xa9\xc3\xa9", 4},
	{"\x22\x5c\x75\x32\x30\x61\x63\x22", "\xe2\x82\xac", 3, "\xe2\x82\xac", 3},
	{"\x22\x5c\x75\x64\x38\x33\x64\x5c\x75\x64\x65\x30\x30\x22", "\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80", 4},
	{"\x22\x5c\x75\x44\x38\x33\x44\x5c\x75\x44\x45\x30\x30\x22", "\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80", 4},
	{"\x22\x5c\x75\x64\x38\x30\x30\x22", "\xef\xbf\xbd", 3, "\xed\xa0\x80", 3},
	{"\x22\x5c\x75\x64\x63\x30\x30\x78\x22", "\xef\xbf\xbd\x78", 4, "\xed\xb0\x80\x78", 4},
	{"\x22\x5c\x75\x64\x38\x30\x30\x5c\x75\x30\x30\x34\x31\x22", "\xef\xbf\xbd\x41", 4, "\xed\xa0\x80\x41", 4},
	{"\x22\x5c\x75\x64\x38\x30\x30\x5c\x75\x64\x38\x30\x30\x5c\x75\x64\x63\x30\x30\x22", "\xef\xbf\xbd\xf0\x90\x80\x80", 7, "\xed\xa0\x80\xf0\x90\x80\x80", 7},
	{"\x22\x5c\x75\x30\x30\x30\x30\x22", "\x00", 1, "\x00", 1},
	{"\x22\x72\x61\x77\x01\x74\x61\x62\x09\x22", "\x72\x61\x77\x01\x74\x61\x62\x09", 8, "\x72\x61\x77\x01\x74\x61\x62\x09", 8},
	{"\x22\x63\x61\x66\xc3\xa9\x20\x72\x61\x77\x22", "\x63\x61\x66\xc3\xa9\x20\x72\x61\x77", 9, "\x63\x61\x66\xc3\xa9\x20\x72\x61\x77", 9},
	{"\x22\x5c\x78\x22", NULL, 0, NULL, 0},
	{"\x22\x5c\x75\x31\x32\x22", NULL, 0, NULL, 0},
	{"\x22\x5c\x75\x31\x32\x67\x34\x22", NULL, 0, NULL, 0},
	{"\x22\x6f\x70\x65\x6e", NULL, 0, NULL, 0},
	{"\x22\x74\x72\x61\x69\x6c\x5c\x22", NULL, 0, NULL, 0},
	{"\x22\x5c\x61\x22", NULL, 0, NULL, 0},
};

static void test_json_read_str(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(loads) / sizeof(loads[0]); i++) {
		const char *in = loads[i].in, *end = in + strlen(in);
		for (int pass = 0; pass < 2; pass++) {
			struct dptp_buf b = {0};
			const char *want = pass ? loads[i].pass : loads[i].fffd;
			size_t nwant = pass ? loads[i].npass : loads[i].nfffd;
			const char *q = dptp_json_read_str(in, end, &b, pass ? DPTP_JSON_SURROGATEPASS : 0);
			if (!want) {
				assert_null(q);
			} else {
				assert_ptr_equal(q, end);
				assert_int_equal(b.len, nwant);
				if (nwant)
					assert_memory_equal(b.buf, want, nwant);
			}
			dptp_buf_release(&b);
		}
	}
	/* what follows the string is left to the caller */
	const char two[] = "\"a\", \"b\"";
	struct dptp_buf b = {0};
	assert_ptr_equal(dptp_json_read_str(two, two + sizeof(two) - 1, &b, 0), two + 3);
	assert_string_equal((char *)b.buf, "a");
	dptp_buf_release(&b);
	static const char x[] = "x";
	assert_null(dptp_json_read_str(x, x + 1, &b, 0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buf),
		cmocka_unit_test(test_hostname),
		cmocka_unit_test(test_getfqdn),
		cmocka_unit_test(test_json_str),
		cmocka_unit_test(test_json_cp),
		cmocka_unit_test(test_utf8_invalid_len),
		cmocka_unit_test(test_json_read_str),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
