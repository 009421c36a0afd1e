#include "run.h"

int main(int argc, char **argv)
{
	return dptp_run_main(argc, argv);
}
