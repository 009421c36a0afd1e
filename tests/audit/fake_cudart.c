/* A stand-in libcudart (the runtime API) for crec_e2e's gpu case. As the
 * real runtime, it reaches the driver only through entry points from
 * cuGetProcAddress, taken from a handle of its own (dlopen + dlsym): the
 * recorder sees the runtime calls, not the driver calls they make. */
#include <dlfcn.h>
#include <stddef.h>

typedef struct {
	char reserved[64];
} ipc_handle;

int cudaGetDevice(int *dev);
int cudaIpcGetMemHandle(ipc_handle *h, void *ptr);
int cudaIpcOpenMemHandle(void **ptr, ipc_handle h, unsigned int flags);
int cudaGetDriverEntryPoint(const char *sym, void **pfn, unsigned long long flags, int *status);

static int (*gpa)(const char *, void **, int, unsigned long long, int *);

static void *drv(const char *sym)
{
	void *fn = NULL;
	if (!gpa) {
		void *h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
		if (!h)
			return NULL;
		gpa = (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(h, "cuGetProcAddress_v2");
		if (!gpa)
			return NULL;
	}
	gpa(sym, &fn, 12000, 0, NULL);
	return fn;
}

int cudaGetDevice(int *dev)
{
	*dev = 0;
	return 0;
}

int cudaIpcGetMemHandle(ipc_handle *h, void *ptr)
{
	int (*fn)(ipc_handle *, unsigned long long) = (int (*)(ipc_handle *, unsigned long long))drv("cuIpcGetMemHandle");
	return fn ? fn(h, (unsigned long long)(size_t)ptr) : 3;
}

int cudaIpcOpenMemHandle(void **ptr, ipc_handle h, unsigned int flags)
{
	int (*fn)(unsigned long long *, ipc_handle, unsigned int) =
		(int (*)(unsigned long long *, ipc_handle, unsigned int))drv("cuIpcOpenMemHandle");
	unsigned long long d = 0;
	int rc = fn ? fn(&d, h, flags) : 3;
	*ptr = (void *)(size_t)d;
	return rc;
}

int cudaGetDriverEntryPoint(const char *sym, void **pfn, unsigned long long flags, int *status)
{
	(void)flags;
	*pfn = drv(sym);
	if (status)
		*status = *pfn ? 0 : 1;
	return 0;
}
