/* dptp-run: main() is a shim over dptp_run_main(). */
#ifndef DPTP_LAUNCHER_DPTP_RUN_H
#define DPTP_LAUNCHER_DPTP_RUN_H

int dptp_run_main(int argc, char **argv);

#endif
