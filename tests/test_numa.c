/* --numa-binding's CPU choice (launcher/numa.c) on a made-up sysfs tree, for
 * every mode of torch 2.11's torch/numa/binding.py. The expected sets follow
 * torch's rules by hand on this topology:
 *
 *   node0: CPUs 0-3,8-11, package 0; cores {c, c+8}; L3 {0,1,8,9} {2,3,10,11}
 *   node1: CPUs 4-7,12-15, package 0; cores {c, c+8}; one L3
 *   node2: memory only (no CPU)
 *   node3: CPUs 16-19, package 1; no SMT; L3 {16} {17,18,19}
 *   GPUs in CUDA order: 0000:01:00.0 (node 0), 0000:81:00.0 (node 1),
 *   0000:02:00.0 (node 0), 0000:c1:00.0 (node 3), 0000:03:00.0 (-1: node 0) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/numa.h"

static const char *GPUS = "0000:01:00.0,0000:81:00.0,0000:02:00.0,0000:C1:00.0,0000:03:00.0";

static void put(const char *root, const char *rel, const char *text)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *c = path + strlen(root) + 1; *c; c++) {
		if (*c != '/')
			continue;
		*c = '\0';
		mkdir(path, 0755);
		*c = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void cache(const char *root, unsigned cpu, unsigned idx, const char *type, int level, const char *shared)
{
	char rel[256], lv[16];
	snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%u/cache/index%u/type", cpu, idx);
	put(root, rel, type);
	snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%u/cache/index%u/level", cpu, idx);
	snprintf(lv, sizeof(lv), "%d\n", level);
	put(root, rel, lv);
	snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%u/cache/index%u/shared_cpu_list", cpu, idx);
	put(root, rel, shared);
}

static int setup(void **state)
{
	char *root = strdup("/tmp/dptp_numa_XXXXXX");
	assert_non_null(mkdtemp(root));
	put(root, "devices/system/node/possible", "0-3\n");
	put(root, "devices/system/node/node0/cpulist", "0-3,8-11\n");
	put(root, "devices/system/node/node1/cpulist", "4-7,12-15\n");
	put(root, "devices/system/node/node2/cpulist", "\n");
	put(root, "devices/system/node/node3/cpulist", "16-19\n");
	put(root, "bus/pci/devices/0000:01:00.0/numa_node", "0\n");
	put(root, "bus/pci/devices/0000:02:00.0/numa_node", "0\n");
	put(root, "bus/pci/devices/0000:03:00.0/numa_node", "-1\n");
	put(root, "bus/pci/devices/0000:81:00.0/numa_node", "1\n");
	put(root, "bus/pci/devices/0000:c1:00.0/numa_node", "3\n");
	for (unsigned c = 0; c < 20; c++) {
		char rel[256], v[64];
		unsigned core = c < 16 ? c % 8 : c;
		snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%u/topology/physical_package_id", c);
		put(root, rel, c < 16 ? "0\n" : "1\n");
		snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%u/topology/thread_siblings_list", c);
		if (c < 16)
			snprintf(v, sizeof(v), "%u,%u\n", core, core + 8);
		else
			snprintf(v, sizeof(v), "%u\n", c);
		put(root, rel, v);
		cache(root, c, 0, "Data\n", 1, v);
		cache(root, c, 1, "Instruction\n", 1, v);
		cache(root, c, 2, "Unified\n", 2, v);
		const char *l3;
		if (c < 16 && core < 2)
			l3 = "0-1,8-9\n";
		else if (c < 16 && core < 4)
			l3 = "2-3,10-11\n";
		else if (c < 16)
			l3 = "4-7,12-15\n";
		else
			l3 = c == 16 ? "16\n" : "17-19\n";
		cache(root, c, 3, "Unified\n", 3, l3);
	}
	*state = root;
	return 0;
}

static int teardown(void **state)
{
	dptp_rm_tree(*state);
	free(*state);
	return 0;
}

static struct numa_mask all_of(const char *list)
{
	struct numa_mask m;
	assert_int_equal(numa_mask_parse(list, &m), 0);
	return m;
}

/* Builds the plan and checks each local rank's CPUs. */
static void expect(void **state, const char *mode, const char *allowed, unsigned n, const char *const *want)
{
	struct numa_plan p;
	struct dptp_err err = {0};
	struct numa_mask a = all_of(allowed);
	int rc = numa_plan_build_at(&p, mode, n, *state, &a, GPUS, &err);
	if (rc < 0)
		fail_msg("%s: %s", mode, err.msg);
	assert_int_equal(p.n, n);
	for (unsigned i = 0; i < n; i++) {
		char got[256];
		numa_mask_format(&p.masks[i], got, sizeof(got));
		if (strcmp(got, want[i]))
			fail_msg("%s, local rank %u: got %s, want %s", mode, i, got, want[i]);
	}
	numa_plan_release(&p);
}

static void expect_error(void **state, const char *mode, const char *allowed, unsigned n, const char *gpus,
	const char *want)
{
	struct numa_plan p;
	struct dptp_err err = {0};
	struct numa_mask a = all_of(allowed);
	assert_true(numa_plan_build_at(&p, mode, n, *state, &a, gpus, &err) < 0);
	if (!strstr(err.msg, want))
		fail_msg("%s: message '%s' lacks '%s'", mode, err.msg, want);
	assert_null(p.masks);
}

static void test_mask_form(void **state)
{
	(void)state;
	struct numa_mask m;
	char buf[64];
	assert_int_equal(numa_mask_parse("0-2,4,6-7\n", &m), 0);
	numa_mask_format(&m, buf, sizeof(buf));
	assert_string_equal(buf, "0-2,4,6-7");
	assert_int_equal(numa_mask_parse("\n", &m), 0);
	numa_mask_format(&m, buf, sizeof(buf));
	assert_string_equal(buf, "");
	assert_int_equal(numa_mask_parse("3-1", &m), -EINVAL);
	assert_int_equal(numa_mask_parse("a", &m), -EINVAL);
	assert_int_equal(numa_mask_parse("1,", &m), 0);
	assert_int_equal(numa_mask_parse("1-", &m), -EINVAL);
	assert_int_equal(numa_mask_parse("99999", &m), -EINVAL);
}

static void test_node(void **state)
{
	const char *want[] = {"0-3,8-11", "4-7,12-15", "0-3,8-11", "16-19", "0-3,8-11"};
	expect(state, "node", "0-19", 5, want);
	/* only within the launcher's own affinity */
	const char *narrow[] = {"0-2,8-11", "4-7,12-15"};
	expect(state, "node", "0-2,4-19", 2, narrow);
}

static void test_socket(void **state)
{
	/* node 2 has no CPU: on no socket (torch would fail on it) */
	const char *want[] = {"0-15", "0-15", "0-15", "16-19", "0-15"};
	expect(state, "socket", "0-19", 5, want);
}

static void test_exclusive(void **state)
{
	/* node 0: 4 cores for GPUs 0, 2 and 4: the lowest GPU gets the extra core */
	const char *want[] = {"0-1,8-9", "4-7,12-15", "2,10", "16-19", "3,11"};
	expect(state, "exclusive", "0-19", 5, want);
	/* a core is its CPUs the launcher may use, keyed by the whole core */
	const char *narrow[] = {"0-1,9", "4-7,12-15", "2,10", "16-19", "3,11"};
	expect(state, "exclusive", "0-7,9-19", 5, narrow);
	expect_error(state, "exclusive", "0,8,4-7,12-19", 1, GPUS,
		"there are only 1 physical cores on NUMA node 0, but there are 3 GPUs associated with this NUMA node");
}

static void test_core_complex(void **state)
{
	/* node 0's two L3 groups in turn; node 3: the bigger group first */
	const char *want[] = {"0-1,8-9", "4-7,12-15", "2-3,10-11", "17-19", "0-1,8-9"};
	expect(state, "core-complex", "0-19", 5, want);
}

static void test_errors(void **state)
{
	expect_error(state, "node", "0-19", 6, GPUS, "local rank 5 has no GPU: 5 CUDA devices are visible");
	expect_error(state, "node", "0-19", 1, "0000:09:00.0", "local rank 0 (GPU 0000:09:00.0): cannot read ");
	expect_error(state, "node", "0-19", 1, "0000:09:00.0", "/bus/pci/devices/0000:09:00.0/numa_node");
	expect_error(state, "node", "16-19", 1, GPUS, "must bind to a non-empty set of CPU indices");
	expect_error(state, "node", "0-19", 1, "../x", "bad PCI address '../x'");
	expect_error(state, "node", "0-19", 1, "", "no CUDA GPUs are available");
	expect_error(state, "bogus", "0-19", 1, GPUS, "affinity mode bogus not supported");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mask_form),
		cmocka_unit_test_setup_teardown(test_node, setup, teardown),
		cmocka_unit_test_setup_teardown(test_socket, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exclusive, setup, teardown),
		cmocka_unit_test_setup_teardown(test_core_complex, setup, teardown),
		cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
