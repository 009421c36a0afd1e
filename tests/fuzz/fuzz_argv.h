/* Splits a fuzz input on NUL bytes into an argv (argv[0] given), at most
 * FUZZ_MAX_ARGS arguments. Every argument is a fresh malloc'd copy so ASan
 * sees reads past its end. Free with fuzz_argv_free(). */
#ifndef DPTP_TESTS_FUZZ_ARGV_H
#define DPTP_TESTS_FUZZ_ARGV_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_ARGS 64

static inline int fuzz_argv_split(const uint8_t *data, size_t size, const char *argv0,
				  char **argv, char **copy)
{
	int argc = 0;
	argv[argc++] = strdup(argv0);
	size_t start = 0;
	for (size_t i = 0; i <= size && argc < FUZZ_MAX_ARGS; i++) {
		if (i == size || data[i] == 0) {
			if (i == size && i == start && size > 0)
				break; /* a trailing NUL ends the list */
			size_t n = i - start;
			char *a = malloc(n + 1);
			memcpy(a, data + start, n);
			a[n] = 0;
			argv[argc++] = a;
			start = i + 1;
		}
	}
	argv[argc] = NULL;
	/* the parser may permute argv (getopt); keep the pointers to free */
	memcpy(copy, argv, sizeof(char *) * (size_t)(argc + 1));
	return argc;
}

static inline void fuzz_argv_free(char **copy)
{
	for (int i = 0; copy[i]; i++)
		free(copy[i]);
}

#endif
