/* test_audit_preload's program: loads LIB (argv[1]) with RTLD_LOCAL and
 * runs its NCCL calls; exits with their result. Run under the audit's
 * LD_PRELOAD, the calls must reach the real (here: fake) libnccl. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 2;
	}
	int (*run)(void) = (int (*)(void))dlsym(h, "fake_user_run");
	int rc = run ? run() : 2;
	printf("nccl calls returned %d\n", rc);
	return rc;
}
