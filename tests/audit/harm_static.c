/* A static binary: no recorder can load into it (issue 30 item 3). */
#include <stdio.h>

int main(void)
{
	puts("static worker");
	return 0;
}
