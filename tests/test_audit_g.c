/* dptp-run --audit, mechanism G for GPU memory (launcher/audit/analyze/g.c):
 * exporter and importer of one CUDA IPC / VMM handle match by `h`; a rank
 * that maps memory of another replica's rank is G on both replicas, at the
 * Python site of the import; a workspace shared within its TP group is
 * healthy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "audit_records.h"

static void gpu(int r, const char *call, unsigned h, const char *pysite)
{
	if (pysite)
		arec(1000 + r, "py", "{\"k\":\"site\",\"call\":\"cuda_%s\",\"key\":\"%016x\",\"site\":\"%s\",\"outer\":\"train.py:3\"}",
			call, h, pysite);
	arec(1000 + r, "c", "{\"k\":\"gpu\",\"call\":\"%s\",\"api\":\"runtime\",\"ht\":\"ipc\",\"h\":\"%016x\",\"dev\":0,\"rc\":0,\"site\":\"libtorch_cuda.so+0x42\"}",
		call, h);
}

/* torch's CUDA tensor IPC gathered within the TP group: healthy */
static void test_within_tp(void **state)
{
	(void)state;
	for (int r = 0; r < 4; r++) {
		arec_rank(r, 4);
		arec_end(r);
		gpu(r, "ipc_get", 0x100u + (unsigned)r, "ws.py:10");
	}
	for (int r = 0; r < 4; r++) /* each maps its TP peer's buffer */
		gpu(r, "ipc_open", 0x100u + (unsigned)(r ^ 1), "ws.py:12");
	/* a failed open is no mapping */
	arec(1000, "c", "{\"k\":\"gpu\",\"call\":\"ipc_open\",\"api\":\"runtime\",\"ht\":\"ipc\",\"h\":\"%016x\",\"dev\":0,\"rc\":1}", 0x102u);
	arec_analyze(-1);
	arec_print();
	assert_int_equal(arec_rep.w[0].nf, 0);
}

/* gathered on WORLD: every rank maps every other one's buffer */
static void test_across_replicas(void **state)
{
	(void)state;
	for (int r = 0; r < 4; r++) {
		arec_rank(r, 4);
		arec_end(r);
		gpu(r, "ipc_get", 0x200u + (unsigned)r, "ws.py:10");
	}
	for (int r = 0; r < 4; r++)
		for (int o = 0; o < 4; o++)
			if (o != r)
				gpu(r, "ipc_open", 0x200u + (unsigned)o, "ws.py:12");
	/* and a VMM handle of rank 3 imported by rank 0, from the C++ side only */
	arec(1003, "c", "{\"k\":\"gpu\",\"call\":\"vmm_export\",\"api\":\"driver\",\"ht\":\"fd\",\"h\":\"00000000000000ff\",\"dev\":1,\"rc\":0,\"site\":\"libflashinfer.so+0x9\"}");
	arec(1000, "c", "{\"k\":\"gpu\",\"call\":\"vmm_import\",\"api\":\"driver\",\"ht\":\"fd\",\"h\":\"00000000000000ff\",\"dev\":0,\"rc\":0,\"site\":\"libflashinfer.so+0xa\"}");
	arec_analyze(-1);
	arec_print();
	const struct audit_result *w = &arec_rep.w[0];
	assert_int_equal(arec_count(0, 'G'), 2);
	bool ipc = false, vmm = false;
	for (size_t i = 0; i < w->nf; i++) {
		const struct audit_finding *f = &w->f[i];
		assert_int_equal(f->nreplicas, 2);
		if (!strcmp(f->site, "ws.py:12")) {
			ipc = true;
			assert_int_equal(f->nranks, 4);
			assert_string_equal(f->op, "cudaIpcOpenMemHandle");
			assert_non_null(strstr(f->detail, "8 mappings of another replica's GPU memory here"));
		} else {
			vmm = true;
			assert_string_equal(f->site, "libflashinfer.so+0xa");
			assert_non_null(strstr(f->detail, "1 mapping of another replica's GPU memory here, e.g. rank 0 (replica 0) maps GPU memory of rank 3 (replica 1)"));
		}
	}
	assert_true(ipc && vmm);
}

/* real records (tests/audit/samples/README.md): torch's CUDA IPC on WORLD
 * is one G finding on both replicas (the segments libcuda and torch open
 * beside it are part of it); on the TP group, none */
static void sample(const char *name, size_t want_g)
{
	char dir[4096];
	const char *root = getenv("DPTP_SOURCE_ROOT");
	struct dptp_err err = {0};
	struct audit_report rep;
	snprintf(dir, sizeof(dir), "%s/tests/audit/samples/%s", root ? root : "..", name);
	assert_int_equal(audit_analyze_job(dir, NULL, -1, &rep, &err), 0);
	assert_int_equal(rep.nw, 1);
	const struct audit_result *w = &rep.w[0];
	assert_true(w->layout_known);
	assert_int_equal(w->layout.dp, 2);
	size_t g = 0;
	for (size_t i = 0; i < w->nf; i++) {
		print_message("# %s: %c %s %s\n", name, w->f[i].mech, w->f[i].site, w->f[i].detail);
		if (w->f[i].mech != 'G')
			continue;
		g++;
		assert_int_equal(w->f[i].nreplicas, 2);
		assert_int_equal(w->f[i].nranks, 4);
	}
	assert_int_equal(g, want_g);
	audit_report_release(&rep);
}

static void test_samples(void **state)
{
	(void)state;
	sample("gpu_world", 1);
	sample("gpu_world_vmm", 1);
	sample("gpu_tp", 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_within_tp, arec_setup, arec_teardown),
		cmocka_unit_test_setup_teardown(test_across_replicas, arec_setup, arec_teardown),
		cmocka_unit_test(test_samples),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
