/* The JSON pieces of --event-log-handler console (launcher/events.c): floats
 * as Python's repr() writes them and a JSON text re-dumped as
 * json.dumps(json.loads(text)). Every expected string below is what
 * Python 3 printed for the same input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "output/events.h"

static void test_float_repr(void **state)
{
	(void)state;
	static const struct {
		double v;
		const char *want;
	} cases[] = {
		{0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1.5e-5, "1.5e-05"},
		{0.0001, "0.0001"}, {123.456, "123.456"}, {-2.5, "-2.5"}, {5e-324, "5e-324"},
		{1.7976931348623157e308, "1.7976931348623157e+308"}, {100.0, "100.0"},
		{0.30000000000000004, "0.30000000000000004"}, {1234567.0, "1234567.0"}, {-0.0, "-0.0"},
		{0.00012, "0.00012"}, {1.357155999997417, "1.357155999997417"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[64];
		events_float_repr(cases[i].v, buf, sizeof(buf));
		if (strcmp(buf, cases[i].want))
			fail_msg("repr(%.17g): got %s, want %s", cases[i].v, buf, cases[i].want);
	}
	char buf[64];
	events_float_repr(INFINITY, buf, sizeof(buf));
	assert_string_equal(buf, "Infinity");
	events_float_repr(NAN, buf, sizeof(buf));
	assert_string_equal(buf, "NaN");
}

static void test_redump(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
		{"{\"a\":1,\"b\":[true,false,null],\"c\":{}}", "{\"a\": 1, \"b\": [true, false, null], \"c\": {}}"},
		{"[1.0, -0, 10E2, \"\\u00E9\\ud83d\\ude00\\u001f\\u007f\\/\"]",
		 "[1.0, 0, 1000.0, \"\\u00e9\\ud83d\\ude00\\u001f\\u007f/\"]"},
		{"\"\\u0022\\\\\"", "\"\\\"\\\\\""},
		{"  {\"message\" : \"x\"}  ", "{\"message\": \"x\"}"},
		{"\"\xc3\xa9\xf0\x9f\x98\x80\"", "\"\\u00e9\\ud83d\\ude00\""},
		{"{\"a\": 1, \"b\": 2, \"\\u0061\": {\"x\": [], \"x\": 3}}", "{\"a\": {\"x\": 3}, \"b\": 2}"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *got = events_json_redump(cases[i][0]);
		if (!got || strcmp(got, cases[i][1]))
			fail_msg("%s: got %s, want %s", cases[i][0], got ? got : "(null)", cases[i][1]);
		free(got);
	}
	/* what json.loads refuses */
	static const char *const bad[] = {"", "{", "{\"a\" 1}", "[1,]", "01", "\"\x01\"", "[1] x", "tru", "\"\\x\"", "{\"a\"}", "{1: 2}"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *got = events_json_redump(bad[i]);
		if (got)
			fail_msg("'%s' accepted as %s", bad[i], got);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_float_repr),
		cmocka_unit_test(test_redump),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
