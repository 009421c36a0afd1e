/* Plays libtorch_cuda (or NCCL, a JIT'd kernel library) for crec_e2e's gpu
 * case: linked to the stand-in libcudart and libcuda, loaded with
 * RTLD_LOCAL. Exports and imports GPU memory through the runtime API, the
 * driver API called directly, driver entry points obtained from
 * cuGetProcAddress and cudaGetDriverEntryPoint, and from a libcuda handle
 * of its own (dlopen + dlsym, as cuda-python takes them). */
#include <dlfcn.h>
#include <stddef.h>

typedef struct {
	char reserved[64];
} ipc_handle;

int cudaIpcGetMemHandle(ipc_handle *h, void *ptr);
int cudaIpcOpenMemHandle(void **ptr, ipc_handle h, unsigned int flags);
int cudaGetDriverEntryPoint(const char *sym, void **pfn, unsigned long long flags, int *status);
int cuIpcGetMemHandle(ipc_handle *h, unsigned long long dptr);
int cuIpcOpenMemHandle_v2(unsigned long long *dptr, ipc_handle h, unsigned int flags);
int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags);
int cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type);
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

int gpu_export(ipc_handle h[4], int *fd, unsigned char fabric[64]);
int gpu_import(ipc_handle h[4], int fd, unsigned char fabric[64]);

typedef int (*ipc_get_fn)(ipc_handle *, unsigned long long);
typedef int (*ipc_open_fn)(unsigned long long *, ipc_handle, unsigned int);
typedef int (*export_fn)(void *, unsigned long long, int, unsigned long long);
typedef int (*import_fn)(unsigned long long *, void *, int);
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

/* name from libcuda's entry points, as a handle of its own gives them */
static void *own_handle(const char *name)
{
	void *lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL), *fn = NULL;
	gpa_fn gpa = lib ? (gpa_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
	if (gpa && gpa(name, &fn, 12000, 0, NULL))
		fn = NULL;
	return fn;
}

/* h[0] by the runtime, h[1] by the driver, h[2] by a driver entry point
 * from cuGetProcAddress, h[3] from a libcuda handle's; a POSIX-fd export
 * from an entry point of cudaGetDriverEntryPoint, a fabric export called
 * directly */
int gpu_export(ipc_handle h[4], int *fd, unsigned char fabric[64])
{
	static char mem[4];
	void *fn = NULL, *fn2 = NULL, *fn3 = own_handle("cuIpcGetMemHandle");
	int rc = cudaIpcGetMemHandle(&h[0], &mem[0]);
	rc |= cuIpcGetMemHandle(&h[1], (unsigned long long)(size_t)&mem[1]);
	rc |= cuGetProcAddress_v2("cuIpcGetMemHandle", &fn, 12000, 0, NULL);
	rc |= fn ? ((ipc_get_fn)fn)(&h[2], (unsigned long long)(size_t)&mem[2]) : 1;
	rc |= fn3 ? ((ipc_get_fn)fn3)(&h[3], (unsigned long long)(size_t)&mem[3]) : 1;
	rc |= cudaGetDriverEntryPoint("cuMemExportToShareableHandle", &fn2, 0, NULL);
	rc |= fn2 ? ((export_fn)fn2)(fd, 7, 1, 0) : 1;
	rc |= cuMemExportToShareableHandle(fabric, 9, 8, 0);
	return rc;
}

int gpu_import(ipc_handle h[4], int fd, unsigned char fabric[64])
{
	void *p = NULL, *fn = NULL, *fn2 = NULL, *fn3 = own_handle("cuIpcOpenMemHandle");
	unsigned long long d = 0, mh = 0;
	int rc = cudaIpcOpenMemHandle(&p, h[0], 1);
	rc |= cuIpcOpenMemHandle_v2(&d, h[1], 1);
	rc |= cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 12000, 0, NULL);
	rc |= fn ? ((ipc_open_fn)fn)(&d, h[2], 1) : 1;
	rc |= fn3 ? ((ipc_open_fn)fn3)(&d, h[3], 1) : 1;
	rc |= cudaGetDriverEntryPoint("cuMemImportFromShareableHandle", &fn2, 0, NULL);
	rc |= fn2 ? ((import_fn)fn2)(&mh, (void *)(size_t)fd, 1) : 1;
	rc |= cuMemImportFromShareableHandle(&mh, fabric, 8);
	return rc;
}
