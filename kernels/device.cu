/* Devices, plain memory, cuMem VMM IPC memory, streams and events. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_util.h"
#include "kernels.h"

/* ---- devices ---- */

int dptp_cuda_device_count(int *count, struct dptp_err *err)
{
	*count = 0;
	cudaError_t e = cudaGetDeviceCount(count);
	if (e == cudaErrorNoDevice) {
		(void)cudaGetLastError();
		*count = 0;
		return 0;
	}
	return dptp_cuda_check(e, err, "cudaGetDeviceCount");
}

int dptp_cuda_set_device(int ordinal, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaSetDevice(ordinal), err, "cudaSetDevice");
	return 0;
}

int dptp_cuda_get_device(int *ordinal, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaGetDevice(ordinal), err, "cudaGetDevice");
	return 0;
}

int dptp_cuda_device_pci_bus_id(int ordinal, char *buf, size_t len, struct dptp_err *err)
{
	if (!buf || len < 13)
		return dptp_kerr(err, -EINVAL, "pci bus id buffer too small");
	DPTP_CU_TRY(cudaDeviceGetPCIBusId(buf, (int)len, ordinal), err, "cudaDeviceGetPCIBusId");
	return 0;
}

int dptp_cuda_device_uuid(int ordinal, char *buf, size_t len, struct dptp_err *err)
{
	if (!buf || len < 41)
		return dptp_kerr(err, -EINVAL, "uuid buffer too small");
	cudaDeviceProp p;
	DPTP_CU_TRY(cudaGetDeviceProperties(&p, ordinal), err, "cudaGetDeviceProperties");
	const unsigned char *u = (const unsigned char *)p.uuid.bytes;
	snprintf(buf, len,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
		 u[13], u[14], u[15]);
	return 0;
}

int dptp_cuda_device_info(int ordinal, char *name, size_t namelen, int *sm_count, int *cc_major,
			  int *cc_minor, struct dptp_err *err)
{
	cudaDeviceProp p;
	DPTP_CU_TRY(cudaGetDeviceProperties(&p, ordinal), err, "cudaGetDeviceProperties");
	if (name && namelen)
		snprintf(name, namelen, "%s", p.name);
	if (sm_count)
		*sm_count = p.multiProcessorCount;
	if (cc_major)
		*cc_major = p.major;
	if (cc_minor)
		*cc_minor = p.minor;
	return 0;
}

int dptp_cuda_device_sync(struct dptp_err *err)
{
	DPTP_CU_TRY(cudaDeviceSynchronize(), err, "cudaDeviceSynchronize");
	return 0;
}

/* ---- plain memory ---- */

int dptp_cuda_malloc(void **dptr, size_t bytes, struct dptp_err *err)
{
	*dptr = NULL;
	cudaError_t e = cudaMalloc(dptr, bytes ? bytes : 1);
	if (e != cudaSuccess) {
		*dptr = NULL;
		char what[64];
		snprintf(what, sizeof(what), "cudaMalloc(%zu)", bytes);
		return dptp_cuda_check(e, err, what);
	}
	return 0;
}

void dptp_cuda_free(void *dptr)
{
	if (dptr)
		(void)cudaFree(dptr);
}

int dptp_cuda_memcpy(void *dst, const void *src, size_t bytes, void *stream, struct dptp_err *err)
{
	if (!stream) {
		DPTP_CU_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), err, "cudaMemcpy");
		return 0;
	}
	DPTP_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream), err,
		    "cudaMemcpyAsync");
	return 0;
}

int dptp_cuda_memset(void *dptr, int byte, size_t bytes, void *stream, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaMemsetAsync(dptr, byte, bytes, (cudaStream_t)stream), err, "cudaMemsetAsync");
	if (!stream)
		DPTP_CU_TRY(cudaStreamSynchronize(0), err, "cudaStreamSynchronize");
	return 0;
}

/* ---- driver API through the runtime's entry points (no -lcuda) ---- */

namespace {

struct Driver {
	PFN_cuDeviceGet_v2000 deviceGet;
	PFN_cuGetErrorString_v6000 errorString;
	PFN_cuGetErrorName_v6000 errorName;
	PFN_cuMemGetAllocationGranularity_v10020 granularity;
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemRelease_v10020 release;
	PFN_cuMemExportToShareableHandle_v10020 exportHandle;
	PFN_cuMemImportFromShareableHandle_v10020 importHandle;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemAddressFree_v10020 addressFree;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemSetAccess_v10020 setAccess;
};

Driver drv;
pthread_once_t drv_once = PTHREAD_ONCE_INIT;
int drv_rc;
char drv_msg[256];

int load_one(const char *sym, void **fn)
{
	cudaDriverEntryPointQueryResult q;
	cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, &q);
	if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
		snprintf(drv_msg, sizeof(drv_msg), "driver entry point %s: %s", sym,
			 e != cudaSuccess ? cudaGetErrorString(e) : "not found");
		(void)cudaGetLastError();
		return -ENODEV;
	}
	return 0;
}

void load_driver(void)
{
	struct {
		const char *sym;
		void **fn;
	} t[] = {
		{"cuDeviceGet", (void **)&drv.deviceGet},
		{"cuGetErrorString", (void **)&drv.errorString},
		{"cuGetErrorName", (void **)&drv.errorName},
		{"cuMemGetAllocationGranularity", (void **)&drv.granularity},
		{"cuMemCreate", (void **)&drv.create},
		{"cuMemRelease", (void **)&drv.release},
		{"cuMemExportToShareableHandle", (void **)&drv.exportHandle},
		{"cuMemImportFromShareableHandle", (void **)&drv.importHandle},
		{"cuMemAddressReserve", (void **)&drv.reserve},
		{"cuMemAddressFree", (void **)&drv.addressFree},
		{"cuMemMap", (void **)&drv.map},
		{"cuMemUnmap", (void **)&drv.unmap},
		{"cuMemSetAccess", (void **)&drv.setAccess},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		drv_rc = load_one(t[i].sym, t[i].fn);
		if (drv_rc)
			return;
	}
}

int driver(struct dptp_err *err)
{
	pthread_once(&drv_once, load_driver);
	if (drv_rc)
		return dptp_kerr(err, drv_rc, "%s", drv_msg);
	return 0;
}

int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS: return 0;
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED: return -ENODEV;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_DEVICE: return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED: return -EOPNOTSUPP;
	default: return -EIO;
	}
}

int cu_check(CUresult r, struct dptp_err *err, const char *what)
{
	if (r == CUDA_SUCCESS)
		return 0;
	const char *s = NULL, *n = NULL;
	if (drv.errorString)
		drv.errorString(r, &s);
	if (drv.errorName)
		drv.errorName(r, &n);
	return dptp_kerr(err, cu_errno(r), "%s: %s (%s)", what, s ? s : "unknown error",
			 n ? n : "?");
}

/* Makes ordinal's primary context current (the runtime creates it). */
int ensure_context(int ordinal, CUdevice *dev, struct dptp_err *err)
{
	int rc = driver(err);
	if (rc)
		return rc;
	int cur = -1;
	DPTP_CU_TRY(cudaGetDevice(&cur), err, "cudaGetDevice");
	if (cur != ordinal)
		return dptp_kerr(err, -EINVAL,
				 "cuMem on device %d while device %d is current: set it first",
				 ordinal, cur);
	DPTP_CU_TRY(cudaFree(0), err, "cudaFree(0) (context creation)");
	return cu_check(drv.deviceGet(dev, ordinal), err, "cuDeviceGet");
}

void fill_prop(CUmemAllocationProp *p, CUdevice dev)
{
	memset(p, 0, sizeof(*p));
	p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->location.id = dev;
	p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

} // namespace

struct dptp_cuda_mem {
	CUmemGenericAllocationHandle handle;
	CUdeviceptr va;
	size_t size;
	bool have_handle, reserved, mapped;
};

int dptp_cuda_mem_granularity(int ordinal, size_t *gran, struct dptp_err *err)
{
	CUdevice dev;
	int rc = ensure_context(ordinal, &dev, err);
	if (rc)
		return rc;
	CUmemAllocationProp p;
	fill_prop(&p, dev);
	return cu_check(drv.granularity(gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), err,
			"cuMemGetAllocationGranularity");
}

/* Reserves, maps and grants access to m->handle of m->size for dev. */
static int map_handle(struct dptp_cuda_mem *m, CUdevice dev, size_t gran, struct dptp_err *err)
{
	int rc = cu_check(drv.reserve(&m->va, m->size, gran, 0, 0), err, "cuMemAddressReserve");
	if (rc)
		return rc;
	m->reserved = true;
	rc = cu_check(drv.map(m->va, m->size, 0, m->handle, 0), err, "cuMemMap");
	if (rc)
		return rc;
	m->mapped = true;
	CUmemAccessDesc a;
	memset(&a, 0, sizeof(a));
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = dev;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return cu_check(drv.setAccess(m->va, m->size, &a, 1), err, "cuMemSetAccess");
}

static size_t round_to(size_t v, size_t g)
{
	return (v + g - 1) / g * g;
}

int dptp_cuda_mem_create(int ordinal, size_t bytes, struct dptp_cuda_mem **out,
			 struct dptp_err *err)
{
	*out = NULL;
	CUdevice dev;
	size_t gran = 0;
	int rc = dptp_cuda_mem_granularity(ordinal, &gran, err);
	if (rc)
		return rc;
	rc = ensure_context(ordinal, &dev, err);
	if (rc)
		return rc;
	struct dptp_cuda_mem *m = (struct dptp_cuda_mem *)calloc(1, sizeof(*m));
	if (!m)
		return dptp_kerr(err, -ENOMEM, "out of host memory");
	m->size = round_to(bytes ? bytes : 1, gran);
	CUmemAllocationProp p;
	fill_prop(&p, dev);
	rc = cu_check(drv.create(&m->handle, m->size, &p, 0), err, "cuMemCreate");
	if (rc)
		goto out;
	m->have_handle = true;
	rc = map_handle(m, dev, gran, err);
	if (rc)
		goto out;
	*out = m;
	return 0;
out:
	dptp_cuda_mem_destroy(m);
	return rc;
}

int dptp_cuda_mem_export(const struct dptp_cuda_mem *m, int *fd, struct dptp_err *err)
{
	*fd = -1;
	int rc = driver(err);
	if (rc)
		return rc;
	int f = -1;
	rc = cu_check(drv.exportHandle(&f, m->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		      err, "cuMemExportToShareableHandle");
	if (rc)
		return rc;
	*fd = f;
	return 0;
}

int dptp_cuda_mem_import(int ordinal, int fd, size_t bytes, struct dptp_cuda_mem **out,
			 struct dptp_err *err)
{
	*out = NULL;
	if (fd < 0 || bytes == 0)
		return dptp_kerr(err, -EINVAL, "cuMem import: bad fd %d or size %zu", fd, bytes);
	CUdevice dev;
	size_t gran = 0;
	int rc = dptp_cuda_mem_granularity(ordinal, &gran, err);
	if (rc)
		return rc;
	rc = ensure_context(ordinal, &dev, err);
	if (rc)
		return rc;
	struct dptp_cuda_mem *m = (struct dptp_cuda_mem *)calloc(1, sizeof(*m));
	if (!m)
		return dptp_kerr(err, -ENOMEM, "out of host memory");
	m->size = round_to(bytes, gran);
	rc = cu_check(drv.importHandle(&m->handle, (void *)(uintptr_t)fd,
				       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		      err, "cuMemImportFromShareableHandle");
	if (rc)
		goto out;
	m->have_handle = true;
	rc = map_handle(m, dev, gran, err);
	if (rc)
		goto out;
	*out = m;
	return 0;
out:
	dptp_cuda_mem_destroy(m);
	return rc;
}

void *dptp_cuda_mem_ptr(const struct dptp_cuda_mem *m)
{
	return m ? (void *)(uintptr_t)m->va : NULL;
}

size_t dptp_cuda_mem_size(const struct dptp_cuda_mem *m)
{
	return m ? m->size : 0;
}

void dptp_cuda_mem_destroy(struct dptp_cuda_mem *m)
{
	if (!m)
		return;
	if (m->mapped)
		drv.unmap(m->va, m->size);
	if (m->reserved)
		drv.addressFree(m->va, m->size);
	if (m->have_handle)
		drv.release(m->handle);
	free(m);
}

/* ---- streams and events ---- */

int dptp_cuda_stream_create(void **stream, struct dptp_err *err)
{
	cudaStream_t s = NULL;
	*stream = NULL;
	DPTP_CU_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), err, "cudaStreamCreate");
	*stream = (void *)s;
	return 0;
}

void dptp_cuda_stream_destroy(void *stream)
{
	if (stream)
		(void)cudaStreamDestroy((cudaStream_t)stream);
}

int dptp_cuda_stream_sync(void *stream, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaStreamSynchronize((cudaStream_t)stream), err, "cudaStreamSynchronize");
	return 0;
}

int dptp_cuda_stream_wait_event(void *stream, void *event, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0), err,
		    "cudaStreamWaitEvent");
	return 0;
}

int dptp_cuda_event_create(void **event, struct dptp_err *err)
{
	cudaEvent_t e = NULL;
	*event = NULL;
	DPTP_CU_TRY(cudaEventCreate(&e), err, "cudaEventCreate");
	*event = (void *)e;
	return 0;
}

void dptp_cuda_event_destroy(void *event)
{
	if (event)
		(void)cudaEventDestroy((cudaEvent_t)event);
}

int dptp_cuda_event_record(void *event, void *stream, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), err,
		    "cudaEventRecord");
	return 0;
}

int dptp_cuda_event_sync(void *event, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaEventSynchronize((cudaEvent_t)event), err, "cudaEventSynchronize");
	return 0;
}

int dptp_cuda_event_elapsed_ms(void *start, void *end, float *ms, struct dptp_err *err)
{
	DPTP_CU_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end), err,
		    "cudaEventElapsedTime");
	return 0;
}
