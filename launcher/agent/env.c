/* Worker command and environment (see env.h). */
#include "agent/env.h"
#include "log/glog.h"
#include "base/buf.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void env_strv_free(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

/* PATH search like Popen: names with a '/' are used as they are. */
static char *resolve(const char *prog)
{
	const char *path = getenv("PATH");
	if (strchr(prog, '/') || !path || !*path)
		return strdup(prog);
	for (const char *p = path; ; ) {
		const char *colon = strchr(p, ':');
		size_t len = colon ? (size_t)(colon - p) : strlen(p);
		char buf[4096];
		int n = snprintf(buf, sizeof(buf), "%.*s%s%s", (int)len, p, len ? "/" : "", prog);
		if (n > 0 && (size_t)n < sizeof(buf) && access(buf, X_OK) == 0)
			return strdup(buf);
		if (!colon)
			break;
		p = colon + 1;
	}
	return strdup(prog); /* execve reports ENOENT with the name */
}

/* torchrun runs PYTHON_EXEC, else its own interpreter (sys.executable): the
 * one of an activated virtual environment, else python3 from PATH. buf
 * holds the venv's path. */
static const char *python_for_workers(char *buf, size_t len)
{
	const char *py = getenv("PYTHON_EXEC"), *venv = getenv("VIRTUAL_ENV");
	if (py && *py)
		return py;
	if (venv && *venv) {
		static const char *const names[] = {"python3", "python"};
		for (size_t i = 0; i < DPTP_ARRAY_LEN(names); i++) {
			int n = snprintf(buf, len, "%s/bin/%s", venv, names[i]);
			if (n > 0 && (size_t)n < len && access(buf, X_OK) == 0)
				return buf;
		}
	}
	return "python3";
}

int env_logs_specs_known(const char *name, struct dptp_err *err)
{
	static const char code[] =
		"import sys\n"
		"from importlib.metadata import entry_points\n"
		"eps = entry_points()\n"
		"group = eps.select(group='torchrun.logs_specs') if hasattr(eps, 'select') else eps.get('torchrun.logs_specs', ())\n"
		"sys.exit(0 if [e for e in group if e.name == sys.argv[1]] else 10)\n";
	char venv_py[4096];
	const char *py = python_for_workers(venv_py, sizeof(venv_py));
	char *const argv[] = {(char *)py, "-c", (char *)code, (char *)name, NULL};
	int st = 0, null = open("/dev/null", O_RDWR | O_CLOEXEC);
	pid_t pid = fork();
	if (pid == 0) {
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
		}
		execvp(py, argv);
		_exit(127);
	}
	if (null >= 0)
		close(null);
	if (pid < 0)
		return dptp_err_set(err, -errno, "cannot start %s to look up the entry point: %s", py, strerror(errno));
	for (int i = 0; ; i++) {
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid)
			break;
		if (w < 0 && errno != EINTR)
			return dptp_err_set(err, -errno, "waiting for %s: %s", py, strerror(errno));
		if (i == 1000) { /* 10 s */
			kill(pid, SIGKILL);
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			return dptp_err_set(err, -ETIMEDOUT, "%s did not look up the entry point within 10 s", py);
		}
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 10))
		return WEXITSTATUS(st) == 0;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		return dptp_err_set(err, -ENOENT, "cannot run %s to look up the entry point", py);
	return dptp_err_set(err, -EIO, "%s could not look up the entry point (%s %d)", py,
			    WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* --run-path: torchrun runs the script by runpy.run_path in a function
 * wrapped by @record, whose error handler writes the exception with its
 * traceback to TORCHELASTIC_ERROR_FILE (errors/error_handler.py) before
 * the worker exits 1; the failure report then shows that traceback. */
static const char run_path_code[] =
	"import json, os, runpy, sys, time, traceback\n"
	"sys.argv = sys.argv[1:]\n"
	"try:\n"
	"    runpy.run_path(sys.argv[0], run_name='__main__')\n"
	"except Exception as e:\n"
	"    f = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
	"    if f:\n"
	"        with open(f, 'w') as fp:\n"
	"            json.dump({'message': {'message': f'{type(e).__name__}: {e}', 'extraInfo': {\n"
	"                'py_callstack': traceback.format_exc(), 'timestamp': str(int(time.time()))}}}, fp)\n"
	"    raise\n";

int env_build_command(const struct run_opts *o, struct worker_cmd *cmd, struct dptp_err *err)
{
	char venv_py[4096];
	const char *py = python_for_workers(venv_py, sizeof(venv_py));
	size_t n = 0, cap = (size_t)o->nscript_args + 6;
	memset(cmd, 0, sizeof(*cmd));
	cmd->argv = calloc(cap, sizeof(char *));
	if (!cmd->argv)
		goto nomem;
	if (o->no_python && !o->run_path) {
		cmd->path = resolve(o->script);
		cmd->entry_name = strdup(o->script);
		cmd->argv[n++] = strdup(o->script);
	} else if (o->run_path) {
		/* torchrun's report names the function entry point */
		cmd->path = resolve(py);
		cmd->entry_name = strdup("run_script_path");
		cmd->argv[n++] = strdup(py);
		cmd->argv[n++] = strdup("-u");
		cmd->argv[n++] = strdup("-c");
		cmd->argv[n++] = strdup(run_path_code);
		cmd->argv[n++] = strdup(o->script);
	} else {
		cmd->path = resolve(py);
		cmd->entry_name = strdup(o->script);
		cmd->argv[n++] = strdup(py);
		cmd->argv[n++] = strdup("-u");
		if (o->module)
			cmd->argv[n++] = strdup("-m");
		cmd->argv[n++] = strdup(o->script);
	}
	for (int i = 0; i < o->nscript_args; i++)
		cmd->argv[n++] = strdup(o->script_args[i]);
	cmd->argc = n;
	if (!cmd->path || !cmd->entry_name)
		goto nomem;
	for (size_t i = 0; i < n; i++)
		if (!cmd->argv[i])
			goto nomem;
	return 0;
nomem:
	env_command_release(cmd);
	return dptp_err_set(err, -ENOMEM, "out of memory");
}

void env_command_release(struct worker_cmd *cmd)
{
	if (!cmd)
		return;
	free(cmd->path);
	env_strv_free(cmd->argv);
	free(cmd->entry_name);
	memset(cmd, 0, sizeof(*cmd));
}

char *env_template_subst(const char *tmpl, const char *const *keys, const char *const *vals, size_t n)
{
	struct dptp_buf out = {0};
	for (const char *c = tmpl; *c; ) {
		const char *rep = NULL;
		size_t skip = 1;
		if (c[0] == '$') {
			if (c[1] == '$') {
				rep = "$";
				skip = 2;
			} else {
				bool braced = c[1] == '{';
				const char *id = c + 1 + braced, *e = id;
				/* Python's idpattern: (?a:[_a-z][_a-z0-9]*), case-insensitive */
				if (*e == '_' || isalpha((unsigned char)*e))
					while (*e == '_' || isalnum((unsigned char)*e))
						e++;
				if (e > id && (!braced || *e == '}')) {
					for (size_t k = 0; k < n; k++)
						if (strlen(keys[k]) == (size_t)(e - id) && !strncmp(keys[k], id, (size_t)(e - id))) {
							rep = vals[k];
							skip = (size_t)(e - c) + braced;
						}
				}
			}
		}
		const char *piece = rep ? rep : c;
		dptp_buf_add(&out, piece, rep ? strlen(rep) : 1);
		c += skip;
	}
	return dptp_buf_detach(&out, NULL);
}

char **env_argv_for(const struct worker_cmd *cmd, unsigned local_rank)
{
	char lr[16];
	const char *keys[] = {"local_rank"};
	const char *vals[] = {lr};
	char **v = calloc(cmd->argc + 1, sizeof(char *));
	if (!v)
		return NULL;
	snprintf(lr, sizeof(lr), "%u", local_rank);
	for (size_t i = 0; i < cmd->argc; i++) {
		v[i] = env_template_subst(cmd->argv[i], keys, vals, 1);
		if (!v[i]) {
			env_strv_free(v);
			return NULL;
		}
	}
	return v;
}

struct kv {
	const char *k;
	char v[1024];
};

static bool overridden(const char *entry, const struct kv *kv, size_t n)
{
	const char *eq = strchr(entry, '=');
	size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
	for (size_t i = 0; i < n; i++)
		if (strlen(kv[i].k) == len && !strncmp(kv[i].k, entry, len))
			return true;
	return false;
}

char **env_build(const struct worker_env_spec *s)
{
	struct kv kv[24];
	size_t n = 0, nenv = 0, out = 0;
	char **v;
	const char *nccl = getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");

#define SET(key, ...) do { kv[n].k = key; snprintf(kv[n].v, sizeof(kv[n].v), __VA_ARGS__); n++; } while (0)
	/* what torchrun's main sets in its own environment (run.py), so they
	 * follow the inherited variables */
	if (s->nproc_per_node > 1 && !getenv("OMP_NUM_THREADS"))
		SET("OMP_NUM_THREADS", "1");
	if (s->signals_to_handle)
		SET("TORCHELASTIC_SIGNALS_TO_HANDLE", "%s", s->signals_to_handle);
	/* the order of torchrun's worker_env dict (local_elastic_agent.py) */
	SET("LOCAL_RANK", "%u", s->virtual_local_rank ? 0u : s->local_rank);
	SET("RANK", "%u", s->global_rank);
	SET("GROUP_RANK", "%u", s->rdzv->group_rank);
	SET("ROLE_RANK", "%u", s->role_rank);
	SET("ROLE_NAME", "%s", s->role);
	SET("LOCAL_WORLD_SIZE", "%u", s->local_world_size);
	SET("WORLD_SIZE", "%u", s->rdzv->global_world_size);
	SET("GROUP_WORLD_SIZE", "%u", s->rdzv->group_world_size);
	SET("ROLE_WORLD_SIZE", "%u", s->rdzv->role_world_size);
	SET("MASTER_ADDR", "%s", s->rdzv->master_addr);
	SET("MASTER_PORT", "%u", s->rdzv->master_port);
	SET("TORCHELASTIC_RESTART_COUNT", "%u", s->restart_count);
	SET("TORCHELASTIC_MAX_RESTARTS", "%u", s->max_restarts);
	SET("TORCHELASTIC_RUN_ID", "%s", s->rdzv->run_id);
	SET("TORCHELASTIC_USE_AGENT_STORE", "%s", s->rdzv->use_agent_store ? "True" : "False");
	SET("TORCH_NCCL_ASYNC_ERROR_HANDLING", "%s", nccl ? nccl : "1");
	SET("TORCHELASTIC_ERROR_FILE", "%s", s->error_file);
	if (s->virtual_local_rank) {
		/* CUDA_VISIBLE_DEVICES narrowed to the worker's own device */
		const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
		if (cvd && *cvd) {
			const char *c = cvd;
			for (unsigned i = 0; i < s->local_rank && c; i++) {
				c = strchr(c, ',');
				if (c)
					c++;
			}
			if (c) {
				const char *e = strchr(c, ',');
				SET("CUDA_VISIBLE_DEVICES", "%.*s", (int)(e ? (size_t)(e - c) : strlen(c)), c);
			} else {
				SET("CUDA_VISIBLE_DEVICES", "%u", s->local_rank);
			}
		} else {
			SET("CUDA_VISIBLE_DEVICES", "%u", s->local_rank);
		}
	}
#undef SET

	for (char **e = environ; *e; e++)
		nenv++;
	v = calloc(nenv + n + 1, sizeof(char *));
	if (!v)
		return NULL;
	for (char **e = environ; *e; e++) {
		if (overridden(*e, kv, n))
			continue;
		if (!(v[out++] = strdup(*e)))
			goto nomem;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(kv[i].k) + strlen(kv[i].v) + 2;
		if (!(v[out] = malloc(len)))
			goto nomem;
		snprintf(v[out++], len, "%s=%s", kv[i].k, kv[i].v);
	}
	return v;
nomem:
	env_strv_free(v);
	return NULL;
}

void env_launcher_setup(const struct run_opts *o, FILE *errs)
{
	if (!getenv("OMP_NUM_THREADS") && o->nproc > 1) {
		static const char *const lines[] = {
			"",
			"*****************************************",
			"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. ",
			"*****************************************",
		};
		char pfx[96];
		glog_prefix('W', pfx, sizeof(pfx));
		for (size_t i = 0; i < DPTP_ARRAY_LEN(lines); i++)
			fprintf(errs, "%s%s\n", pfx, lines[i]);
		fflush(errs);
	}
}
