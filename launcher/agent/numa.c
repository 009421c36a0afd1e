/* --numa-binding (see numa.h). */
#include "agent/numa.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ADDR_LEN = 32, MAX_GPUS = 256 };

static bool mask_has(const struct numa_mask *m, unsigned c)
{
	return c < NUMA_MAX_CPUS && (m->bits[c / 64] >> (c % 64) & 1);
}

static void mask_set(struct numa_mask *m, unsigned c)
{
	if (c < NUMA_MAX_CPUS)
		m->bits[c / 64] |= (uint64_t)1 << (c % 64);
}

static void mask_and(struct numa_mask *m, const struct numa_mask *o)
{
	for (size_t i = 0; i < DPTP_ARRAY_LEN(m->bits); i++)
		m->bits[i] &= o->bits[i];
}

static void mask_or(struct numa_mask *m, const struct numa_mask *o)
{
	for (size_t i = 0; i < DPTP_ARRAY_LEN(m->bits); i++)
		m->bits[i] |= o->bits[i];
}

/* The lowest CPU in m, or -1 when m is empty. */
static int mask_first(const struct numa_mask *m)
{
	for (unsigned c = 0; c < NUMA_MAX_CPUS; c++)
		if (mask_has(m, c))
			return (int)c;
	return -1;
}

static unsigned mask_count(const struct numa_mask *m)
{
	unsigned n = 0;
	for (size_t i = 0; i < DPTP_ARRAY_LEN(m->bits); i++)
		n += (unsigned)__builtin_popcountll(m->bits[i]);
	return n;
}

int numa_mask_parse(const char *s, struct numa_mask *m)
{
	memset(m, 0, sizeof(*m));
	while (*s) {
		char *end;
		unsigned long a, b;
		while (*s == ' ' || *s == '\n' || *s == '\t')
			s++;
		if (!*s)
			break;
		if (*s < '0' || *s > '9')
			return -EINVAL;
		a = b = strtoul(s, &end, 10);
		if (*end == '-') {
			if (end[1] < '0' || end[1] > '9')
				return -EINVAL;
			b = strtoul(end + 1, &end, 10);
		}
		if (b < a || b >= NUMA_MAX_CPUS)
			return -EINVAL;
		for (unsigned long c = a; c <= b; c++)
			mask_set(m, (unsigned)c);
		while (*end == ' ' || *end == '\n' || *end == '\t')
			end++;
		if (*end == ',')
			end++;
		else if (*end)
			return -EINVAL;
		s = end;
	}
	return 0;
}

void numa_mask_format(const struct numa_mask *m, char *buf, size_t len)
{
	size_t off = 0;
	buf[0] = '\0';
	for (unsigned c = 0; c < NUMA_MAX_CPUS && off < len; c++) {
		if (!mask_has(m, c))
			continue;
		unsigned e = c;
		while (e + 1 < NUMA_MAX_CPUS && mask_has(m, e + 1))
			e++;
		int w = e == c ? snprintf(buf + off, len - off, "%s%u", off ? "," : "", c)
			       : snprintf(buf + off, len - off, "%s%u-%u", off ? "," : "", c, e);
		if (w < 0)
			break;
		off += (size_t)w;
		c = e;
	}
}

struct topo {
	const char *root;           /* /sys, or the test hook's folder */
	struct numa_mask allowed;   /* the launcher's own affinity */
	char addr[MAX_GPUS][ADDR_LEN];
	int node[MAX_GPUS];         /* -1: not read yet */
	unsigned ngpus;
	struct dptp_err *err;
};

/* Reads a small sysfs file, rel below the root, into buf (terminated). */
static int read_rel(const struct topo *t, char *buf, size_t len, const char *rel)
{
	char path[4352];
	snprintf(path, sizeof(path), "%s/%s", t->root, rel);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return dptp_err_set(t->err, -errno, "cannot read %s: %s", path, strerror(errno));
	ssize_t n = read(fd, buf, len - 1);
	int e = errno;
	close(fd);
	if (n < 0)
		return dptp_err_set(t->err, -e, "cannot read %s: %s", path, strerror(e));
	buf[n] = '\0';
	return 0;
}

#define REL(rel, ...) (snprintf(rel, sizeof(rel), __VA_ARGS__), rel)

static int read_int(const struct topo *t, const char *rel, long *v)
{
	char buf[64], *end;
	int rc = read_rel(t, buf, sizeof(buf), rel);
	if (rc < 0)
		return rc;
	errno = 0;
	*v = strtol(buf, &end, 10);
	if (end == buf || errno || (*end && *end != '\n'))
		return dptp_err_set(t->err, -EINVAL, "unexpected content '%.20s' in %s/%s", buf, t->root, rel);
	return 0;
}

static int read_mask(const struct topo *t, const char *rel, struct numa_mask *m)
{
	char buf[8192];
	int rc = read_rel(t, buf, sizeof(buf), rel);
	if (rc < 0)
		return rc;
	if (numa_mask_parse(buf, m) < 0)
		return dptp_err_set(t->err, -EINVAL, "unexpected CPU list '%.40s' in %s/%s", buf, t->root, rel);
	return 0;
}

/* CUDA's device enumeration through the driver library: the order, the
 * CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER handling are the ones torch's
 * get_device_properties sees. */
static int cuda_addrs(struct topo *t)
{
	typedef int (*init_fn)(unsigned);
	typedef int (*count_fn)(int *);
	typedef int (*get_fn)(int *, int);
	typedef int (*attr_fn)(int *, int, int);
	typedef int (*errstr_fn)(int, const char **);
	enum { ATTR_PCI_BUS = 33, ATTR_PCI_DEVICE = 34, ATTR_PCI_DOMAIN = 50, NO_DEVICE = 100 };
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return dptp_err_set(t->err, -ENODEV, "no CUDA driver to map GPUs to NUMA nodes (%s)", dlerror());
	init_fn cu_init = (init_fn)dlsym(h, "cuInit");
	count_fn cu_count = (count_fn)dlsym(h, "cuDeviceGetCount");
	get_fn cu_get = (get_fn)dlsym(h, "cuDeviceGet");
	attr_fn cu_attr = (attr_fn)dlsym(h, "cuDeviceGetAttribute");
	errstr_fn cu_str = (errstr_fn)dlsym(h, "cuGetErrorString");
	if (!cu_init || !cu_count || !cu_get || !cu_attr)
		return dptp_err_set(t->err, -ENODEV, "libcuda.so.1 lacks the device queries");
	int rc = cu_init(0), count = 0;
	if (rc == NO_DEVICE)
		return dptp_err_set(t->err, -ENODEV, "no CUDA GPUs are available");
	if (rc == 0)
		rc = cu_count(&count);
	for (int i = 0; rc == 0 && i < count && i < MAX_GPUS; i++) {
		int dev, dom = 0, bus = 0, slot = 0;
		rc = cu_get(&dev, i);
		if (rc == 0)
			rc = cu_attr(&dom, ATTR_PCI_DOMAIN, dev);
		if (rc == 0)
			rc = cu_attr(&bus, ATTR_PCI_BUS, dev);
		if (rc == 0)
			rc = cu_attr(&slot, ATTR_PCI_DEVICE, dev);
		/* torch's form of the sysfs name: function 0 */
		snprintf(t->addr[i], ADDR_LEN, "%04x:%02x:%02x.0", (unsigned)dom, (unsigned)bus, (unsigned)slot);
		t->ngpus = (unsigned)i + 1;
	}
	if (rc != 0) {
		const char *s = NULL;
		if (!cu_str || cu_str(rc, &s) != 0 || !s)
			s = "unknown error";
		return dptp_err_set(t->err, -EIO, "CUDA device query failed: %s (CUresult %d)", s, rc);
	}
	/* the library stays loaded: unloading a driver library is not safe */
	return 0;
}

/* The test hook's list, as if CUDA had reported it. */
static int gpu_list(struct topo *t, const char *hook)
{
	for (const char *c = hook; *c && t->ngpus < MAX_GPUS;) {
		size_t len = strcspn(c, ",");
		if (len == 0 || len >= ADDR_LEN)
			return dptp_err_set(t->err, -EINVAL, "DPTP_RUN_TEST_GPU_BUS_IDS: bad entry '%.*s'", (int)len, c);
		for (size_t i = 0; i < len; i++)
			t->addr[t->ngpus][i] = (char)(c[i] >= 'A' && c[i] <= 'F' ? c[i] - 'A' + 'a' : c[i]);
		t->addr[t->ngpus][len] = '\0';
		t->ngpus++;
		c += len;
		if (*c == ',')
			c++;
	}
	if (!t->ngpus)
		return dptp_err_set(t->err, -ENODEV, "no CUDA GPUs are available");
	return 0;
}

static int gpu_node(struct topo *t, unsigned gpu)
{
	long v;
	if (t->node[gpu] >= 0)
		return t->node[gpu];
	if (strchr(t->addr[gpu], '/') || strstr(t->addr[gpu], ".."))
		return dptp_err_set(t->err, -EINVAL, "bad PCI address '%s'", t->addr[gpu]);
	char rel[128];
	int rc = read_int(t, REL(rel, "bus/pci/devices/%s/numa_node", t->addr[gpu]), &v);
	if (rc < 0)
		return rc;
	/* a machine of one NUMA node often says -1: that node is 0 */
	t->node[gpu] = v < 0 ? 0 : (int)v;
	return t->node[gpu];
}

/* The node's CPUs that the launcher may use. */
static int node_cpus(const struct topo *t, unsigned node, struct numa_mask *m)
{
	char rel[128];
	int rc = read_mask(t, REL(rel, "devices/system/node/node%u/cpulist", node), m);
	if (rc < 0)
		return dptp_err_set(t->err, rc, "could not determine the CPUs of NUMA node %u: %s", node, t->err->msg);
	mask_and(m, &t->allowed);
	return 0;
}

static int cpu_package(const struct topo *t, unsigned cpu, long *pkg)
{
	char rel[128];
	return read_int(t, REL(rel, "devices/system/cpu/cpu%u/topology/physical_package_id", cpu), pkg);
}

static int socket_cpus(struct topo *t, unsigned node, struct numa_mask *out)
{
	struct numa_mask own, possible, m;
	long pkg, other;
	int rc = node_cpus(t, node, &own);
	if (rc < 0)
		return rc;
	if (mask_first(&own) < 0)
		return dptp_err_set(t->err, -ENOENT, "NUMA node %u has no CPU this launcher may use", node);
	if ((rc = cpu_package(t, (unsigned)mask_first(&own), &pkg)) < 0)
		return rc;
	if ((rc = read_mask(t, "devices/system/node/possible", &possible)) < 0)
		return rc;
	memset(out, 0, sizeof(*out));
	for (unsigned n = 0; n < NUMA_MAX_CPUS; n++) {
		if (!mask_has(&possible, n))
			continue;
		if ((rc = node_cpus(t, n, &m)) < 0)
			return rc;
		/* torch fails on a node without usable CPUs (a memory-only
		 * node): such a node is on no socket here and is skipped */
		if (mask_first(&m) < 0)
			continue;
		if ((rc = cpu_package(t, (unsigned)mask_first(&m), &other)) < 0)
			return rc;
		if (other == pkg)
			mask_or(out, &m);
	}
	return 0;
}

/* Key of a CPU for grouping: the lowest CPU of its physical core (kind 0)
 * or of its last-level data/unified cache (kind 1). */
static int cpu_group_key(const struct topo *t, unsigned cpu, int kind, unsigned *key)
{
	struct numa_mask m;
	int rc;
	if (kind == 0) {
		char rel[128];
		rc = read_mask(t, REL(rel, "devices/system/cpu/cpu%u/topology/thread_siblings_list", cpu), &m);
	} else {
		char dir[4352], buf[64];
		long best = -1;
		snprintf(dir, sizeof(dir), "%s/devices/system/cpu/cpu%u/cache", t->root, cpu);
		DIR *d = opendir(dir);
		if (!d)
			return dptp_err_set(t->err, -errno, "cannot read %s: %s", dir, strerror(errno));
		memset(&m, 0, sizeof(m));
		rc = 0;
		for (struct dirent *e; rc == 0 && (e = readdir(d));) {
			char *end;
			long level;
			if (strncmp(e->d_name, "index", 5) || !e->d_name[5])
				continue;
			unsigned long idx = strtoul(e->d_name + 5, &end, 10);
			if (*end)
				continue;
			char rel[128];
			const char *base = "devices/system/cpu/cpu";
			if ((rc = read_rel(t, buf, sizeof(buf), REL(rel, "%s%u/cache/index%lu/type", base, cpu, idx))) < 0)
				break;
			if (strcmp(buf, "Unified\n") && strcmp(buf, "Data\n") && strcmp(buf, "Unified") && strcmp(buf, "Data"))
				continue;
			if ((rc = read_int(t, REL(rel, "%s%u/cache/index%lu/level", base, cpu, idx), &level)) < 0 || level <= best)
				continue;
			best = level;
			rc = read_mask(t, REL(rel, "%s%u/cache/index%lu/shared_cpu_list", base, cpu, idx), &m);
		}
		closedir(d);
	}
	if (rc < 0)
		return rc;
	int first = mask_first(&m);
	if (first < 0)
		return dptp_err_set(t->err, -ENOENT, "CPU %u: no %s information under %s/devices/system/cpu", cpu,
			kind == 0 ? "core" : "cache", t->root);
	*key = (unsigned)first;
	return 0;
}

struct group {
	unsigned key;
	struct numa_mask cpus;
};

/* The node's usable CPUs grouped by core (kind 0) or last-level cache
 * (kind 1), in order of key. */
static int groups_of(const struct topo *t, const struct numa_mask *cpus, int kind, struct group **out, unsigned *n)
{
	struct group *g = NULL;
	unsigned ng = 0;
	*out = NULL;
	*n = 0;
	for (unsigned c = 0; c < NUMA_MAX_CPUS; c++) {
		unsigned key = 0, i;
		if (!mask_has(cpus, c))
			continue;
		int rc = cpu_group_key(t, c, kind, &key);
		if (rc < 0) {
			free(g);
			return rc;
		}
		for (i = 0; i < ng && g[i].key != key; i++)
			;
		if (i == ng) {
			struct group *more = realloc(g, (ng + 1) * sizeof(*g));
			if (!more) {
				free(g);
				return dptp_err_set(t->err, -ENOMEM, "out of memory");
			}
			g = more;
			memset(&g[ng], 0, sizeof(g[ng]));
			g[ng++].key = key;
		}
		mask_set(&g[i].cpus, c);
	}
	for (unsigned i = 1; i < ng; i++) /* by key */
		for (unsigned k = i; k > 0 && g[k - 1].key > g[k].key; k--) {
			struct group tmp = g[k];
			g[k] = g[k - 1];
			g[k - 1] = tmp;
		}
	*out = g;
	*n = ng;
	return 0;
}

/* The GPU's place among the node's GPUs (all visible devices, in order). */
static int place_on_node(struct topo *t, unsigned gpu, unsigned node, unsigned *pos, unsigned *count)
{
	*pos = *count = 0;
	for (unsigned i = 0; i < t->ngpus; i++) {
		int n = gpu_node(t, i);
		if (n < 0)
			return n;
		if ((unsigned)n != node)
			continue;
		if (i < gpu)
			(*pos)++;
		(*count)++;
	}
	return 0;
}

/* exclusive (kind 0, by physical core) and core-complex (kind 1, by
 * last-level cache): the node's usable CPUs in groups, shared out among
 * the node's GPUs. */
static int shared_cpus(struct topo *t, unsigned gpu, unsigned node, int kind, struct numa_mask *out)
{
	struct numa_mask cpus;
	struct group *g;
	unsigned ng = 0, pos = 0, count = 1;
	int rc = node_cpus(t, node, &cpus);
	if (rc == 0)
		rc = place_on_node(t, gpu, node, &pos, &count);
	if (rc == 0)
		rc = groups_of(t, &cpus, kind, &g, &ng);
	if (rc < 0)
		return rc;
	memset(out, 0, sizeof(*out));
	if (kind == 0) {
		/* an even share of the cores; the lowest GPUs get one more */
		unsigned per = ng / count, extra = ng % count;
		if (per < 1) {
			free(g);
			return dptp_err_set(t->err, -ENOSPC, "there are only %u physical cores on NUMA node %u, but there are %u GPUs associated with this NUMA node",
				ng, node, count);
		}
		unsigned start = pos * per + (pos < extra ? pos : extra);
		unsigned end = start + per + (pos < extra ? 1 : 0);
		for (unsigned i = start; i < end; i++)
			mask_or(out, &g[i].cpus);
	} else if (ng) {
		/* one cache group each, the biggest first, then the lowest key
		 * (a stable sort of the key order); round robin past the last */
		for (unsigned i = 1; i < ng; i++)
			for (unsigned k = i; k > 0 && mask_count(&g[k - 1].cpus) < mask_count(&g[k].cpus); k--) {
				struct group tmp = g[k];
				g[k] = g[k - 1];
				g[k - 1] = tmp;
			}
		*out = g[pos % ng].cpus;
	}
	free(g);
	return 0;
}

static int cpus_for(struct topo *t, const char *mode, unsigned gpu, struct numa_mask *out)
{
	int node = gpu_node(t, gpu);
	if (node < 0)
		return node;
	if (!strcmp(mode, "node"))
		return node_cpus(t, (unsigned)node, out);
	if (!strcmp(mode, "socket"))
		return socket_cpus(t, (unsigned)node, out);
	if (!strcmp(mode, "exclusive"))
		return shared_cpus(t, gpu, (unsigned)node, 0, out);
	if (!strcmp(mode, "core-complex"))
		return shared_cpus(t, gpu, (unsigned)node, 1, out);
	return dptp_err_set(t->err, -EINVAL, "affinity mode %s not supported", mode);
}

int numa_plan_build_at(struct numa_plan *p, const char *mode, unsigned nlocal, const char *root,
	const struct numa_mask *allowed, const char *gpus, struct dptp_err *err)
{
	struct topo *t = calloc(1, sizeof(*t));
	int rc = 0;
	memset(p, 0, sizeof(*p));
	if (!t)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	t->err = err;
	t->root = root;
	t->allowed = *allowed;
	for (unsigned i = 0; i < MAX_GPUS; i++)
		t->node[i] = -1;
	if ((rc = gpus ? gpu_list(t, gpus) : cuda_addrs(t)) < 0)
		goto out;
	p->masks = calloc(nlocal ? nlocal : 1, sizeof(*p->masks));
	if (!p->masks) {
		rc = dptp_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	p->n = nlocal;
	for (unsigned i = 0; i < nlocal; i++) {
		if (i >= t->ngpus) {
			rc = dptp_err_set(err, -ENODEV, "local rank %u has no GPU: %u CUDA device%s visible", i, t->ngpus,
				t->ngpus == 1 ? " is" : "s are");
			goto out;
		}
		if ((rc = cpus_for(t, mode, i, &p->masks[i])) < 0) {
			dptp_err_prefix(err, "local rank %u (GPU %s)", i, t->addr[i]);
			goto out;
		}
		if (mask_first(&p->masks[i]) < 0) {
			rc = dptp_err_set(err, -ENOENT, "local rank %u (GPU %s): must bind to a non-empty set of CPU indices", i,
				t->addr[i]);
			goto out;
		}
	}
out:
	if (rc < 0)
		numa_plan_release(p);
	free(t);
	return rc;
}

int numa_plan_build(struct numa_plan *p, const char *mode, unsigned nlocal, struct dptp_err *err)
{
	struct numa_mask allowed = {0};
	const char *root = getenv("DPTP_RUN_TEST_SYSFS");
	memset(p, 0, sizeof(*p));
	if (sched_getaffinity(0, sizeof(allowed.bits), (cpu_set_t *)(void *)allowed.bits) < 0)
		return dptp_err_set(err, -errno, "sched_getaffinity: %s", strerror(errno));
	return numa_plan_build_at(p, mode, nlocal, root && *root ? root : "/sys", &allowed,
		getenv("DPTP_RUN_TEST_GPU_BUS_IDS"), err);
}

void numa_plan_release(struct numa_plan *p)
{
	free(p->masks);
	memset(p, 0, sizeof(*p));
}
