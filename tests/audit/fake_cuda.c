/* A stand-in libcuda (the driver API) for crec_e2e's gpu case: IPC handles
 * made from the pointer, VMM exports as a memfd (POSIX fd type) or 64
 * bytes (fabric type), and cuGetProcAddress handing out these functions,
 * as the driver hands out its entry points. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
	char reserved[64];
} ipc_handle;

int cuCtxGetDevice(int *dev);
int cuIpcGetMemHandle(ipc_handle *h, unsigned long long dptr);
int cuIpcOpenMemHandle(unsigned long long *dptr, ipc_handle h, unsigned int flags);
int cuIpcOpenMemHandle_v2(unsigned long long *dptr, ipc_handle h, unsigned int flags);
int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags);
int cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type);
int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

int cuCtxGetDevice(int *dev)
{
	const char *d = getenv("FAKE_CUDA_DEV");
	*dev = d ? atoi(d) : 0;
	return 0;
}

static int own_ipc_get(ipc_handle *h, unsigned long long dptr)
{
	for (size_t i = 0; i < sizeof(h->reserved); i++)
		h->reserved[i] = (char)(dptr >> (8 * (i % 8)));
	return 0;
}

static int own_ipc_open(unsigned long long *dptr, ipc_handle h, unsigned int flags)
{
	(void)flags;
	memcpy(dptr, h.reserved, sizeof(*dptr));
	return 0;
}



static int own_export(void *shareable, unsigned long long handle, int type, unsigned long long flags)
{
	(void)flags;
	if (type == 1) {
		int fd = memfd_create("fake_vmm", MFD_CLOEXEC);
		if (fd < 0)
			return 999;
		*(int *)shareable = fd;
		return 0;
	}
	if (type == 8) {
		memset(shareable, 0, 64);
		memcpy(shareable, &handle, sizeof(handle));
		return 0;
	}
	return 1; /* CUDA_ERROR_INVALID_VALUE */
}

static int own_import(unsigned long long *handle, void *os_handle, int type)
{
	(void)os_handle;
	*handle = (unsigned long long)type;
	return 0;
}

/* the entry points handed out: the library's own code, as the driver's
 * are (not its exported symbols, which the recorder interposes) */
#define OWN(fn) ((void *)own_##fn)
static int own_ipc_get(ipc_handle *h, unsigned long long dptr);
static int own_ipc_open(unsigned long long *dptr, ipc_handle h, unsigned int flags);
static int own_export(void *shareable, unsigned long long handle, int type, unsigned long long flags);
static int own_import(unsigned long long *handle, void *os_handle, int type);
static int own_gpa(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static const struct {
	const char *name;
	void *fn;
} procs[] = {
	{"cuIpcGetMemHandle", OWN(ipc_get)},
	{"cuIpcOpenMemHandle", OWN(ipc_open)},
	{"cuMemExportToShareableHandle", OWN(export)},
	{"cuMemImportFromShareableHandle", OWN(import)},
	{"cuGetProcAddress", OWN(gpa)},
};

static int own_gpa(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
	(void)ver, (void)flags;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++)
		if (!strcmp(sym, procs[i].name)) {
			*pfn = procs[i].fn;
			if (status)
				*status = 0;
			return 0;
		}
	*pfn = NULL;
	if (status)
		*status = 1;
	return 500; /* CUDA_ERROR_NOT_FOUND */
}

int cuIpcGetMemHandle(ipc_handle *h, unsigned long long dptr)
{
	return own_ipc_get(h, dptr);
}

int cuIpcOpenMemHandle(unsigned long long *dptr, ipc_handle h, unsigned int flags)
{
	return own_ipc_open(dptr, h, flags);
}

int cuIpcOpenMemHandle_v2(unsigned long long *dptr, ipc_handle h, unsigned int flags)
{
	return own_ipc_open(dptr, h, flags);
}

int cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type, unsigned long long flags)
{
	return own_export(shareable, handle, type, flags);
}

int cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type)
{
	return own_import(handle, os_handle, type);
}

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status)
{
	return own_gpa(sym, pfn, ver, flags, status);
}

int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags)
{
	return own_gpa(sym, pfn, ver, flags, NULL);
}
