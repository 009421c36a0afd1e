/* The floor for bench/launch.py: fork/exec N copies of a program and wait
 * for them all. usage: forkexec N PROGRAM [ARGS...] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[1]) : 0;
	if (n <= 0) {
		fprintf(stderr, "usage: forkexec N PROGRAM [ARGS...]\n");
		return 2;
	}
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0) {
			execv(argv[2], argv + 2);
			_exit(127);
		}
	}
	int st, bad = 0;
	while (wait(&st) > 0)
		bad |= !WIFEXITED(st) || WEXITSTATUS(st);
	return bad;
}
