#include "agent/dptp_run.h"

int main(int argc, char **argv)
{
	return dptp_run_main(argc, argv);
}
