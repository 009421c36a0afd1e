/* A second interposer, preloaded after the recorder (crec_e2e's next case):
 * its getpid() takes the next definition with dlsym(RTLD_NEXT), which must
 * be relative to this library although the recorder interposes dlsym. */
#include <dlfcn.h>
#include <unistd.h>

pid_t getpid(void)
{
	pid_t (*nx)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
	return nx && nx != getpid ? nx() : -1;
}
