int dptp_check_main(int argc, char **argv);
int main(int argc, char **argv) { return dptp_check_main(argc, argv); }
