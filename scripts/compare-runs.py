#!/usr/bin/env python3
"""Runs one set of jobs with two builds and compares what a user sees.

usage: scripts/compare-runs.py BASE_BUILD NEW_BUILD [--keep DIR]

For a refactor that must not change behaviour (issue 26: launcher/ in
layers; earlier lib/): both builds run the same dptp-run and dptp-check
jobs -- every fault injected, the layout sweep, failing and signalled
workers, usage errors -- and their --help, man pages, exit codes, JSON
reports, JUnit files and dptp-run's failure reports are compared after the
values that vary from run to run on one build too (seconds, ports, pids,
random names, timestamps) are masked. Exit 0 when equal, 1 with a diff of
each differing run. Runs one job at a time; about a minute.
"""
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

MASKS = [
    (re.compile(r'"seconds": [0-9.e-]+'), '"seconds": S'),
    (re.compile(r'time="[0-9.]+"'), 'time="S"'),
    (re.compile(r'\b[0-9a-f]{12,}\b'), 'HEX'),
    (re.compile(r'\bport \d+'), 'port P'),
    (re.compile(r'\b(pid|PID)[ =:]+\d+'), r'\1 N'),
    (re.compile(r'"(pid|timestamp|start_time|end_time)": ?"?[0-9.]+"?'), r'"\1": N'),
    (re.compile(r'\d{4}-\d\d-\d\d[ T_]\d\d[:_]\d\d[:_]\d\d(\.\d+)?'), 'DATE'),
    (re.compile(r'\b\d+\.\d+ ?(s|ms|us)\b'), 'T'),
    (re.compile(r'/tmp/[^\s"\']+'), '/tmp/X'),
    (re.compile(r'torchelastic_[a-z0-9_]+'), 'torchelastic_X'),
    (re.compile(r'127\.0\.0\.1:\d+'), '127.0.0.1:P'),
    (re.compile(r'\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ '), 'GLOG '),
    (re.compile(r'\bprocess \d+'), 'process N'),
]


def mask(text):
    for pat, rep in MASKS:
        text = pat.sub(rep, text)
    return text


def jobs(b):
    run, check = f'{b}/launcher/dptp-run', f'{b}/cli/dptp-check'
    faults = subprocess.run([check, '--list'], capture_output=True, text=True).stdout
    faults = re.findall(r'^  ([a-z][a-z0-9-]+)\s', faults.split('Faults')[-1], re.M)
    out = [('help-run', [run, '--help']), ('help-check', [check, '--help']),
           ('list', [check, '--list']), ('version', [check, '--version'])]
    for fmt in ('json', 'junit', 'text'):
        out.append((f'dp2tp2-{fmt}', [run, '--nproc-per-node', '4', '--no-python',
                                       check, '--tp', '2', '--format', fmt, '--checks',
                                       'broadcast,device-map,reduce-span,lockstep']))
    for f in faults:
        out.append((f'inject-{f}', [run, '--nproc-per-node', '4', '--no-python', check,
                                     '--tp', '2', '--format', 'json', '--inject', f]))
    out += [
        ('layouts', [run, '--nproc-per-node', '4', '--no-python', check, '--layouts', 'all',
                     '--format', 'json', '--checks', 'broadcast,reduce-span']),
        ('worker-fails', [run, '--nproc-per-node', '2', '--no-python', 'sh', '-c',
                          '[ $LOCAL_RANK = 1 ] && exit 3; exec sleep 30']),
        ('worker-signal', [run, '--nproc-per-node', '2', '--no-python', 'sh', '-c',
                           '[ $LOCAL_RANK = 1 ] && kill -SEGV $$$$; exec sleep 30']),  # $$: torchrun's $
        ('restarts', [run, '--nproc-per-node', '2', '--max-restarts', '1',
                      '--monitor-interval', '0.05', '--no-python', 'sh', '-c',
                      '[ $LOCAL_RANK = 1 ] && exit 1; exec sleep 30']),
        ('env', [run, '--nproc-per-node', '2', '--no-python', 'sh', '-c',
                 '[ $LOCAL_RANK = 1 ] || env | grep -E "^(RANK|WORLD_SIZE|LOCAL_|GROUP_|ROLE_|TORCHELASTIC_RE|OMP_|MASTER_ADDR)" | sort']),
        ('usage-bad-nproc', [run, '--nproc-per-node', 'x', 'true']),
        ('usage-bad-tp', [check, '--tp', '0x2']),
        ('usage-layouts', [check, '--layouts', '2642x2501x650']),
        ('no-program', [run, '--nproc-per-node', '1', '--no-python', '/nonexistent/prog']),
    ]
    if subprocess.run(['/usr/bin/python3', '-c', 'import torch'], capture_output=True).returncode == 0:
        # a DP2TP2 program whose DP broadcast names the group-local root (BUGS.md bug 2)
        out.append(('audit', [run, '--audit', '--audit-format', 'json', '--audit-output', '/dev/stdout',
                              '--nproc-per-node', '4', '--no-python', '/usr/bin/python3', '-c', AUDIT_PROG]))
    return out


AUDIT_PROG = '''
import torch, torch.distributed as d
d.init_process_group("gloo")
r = d.get_rank()
tp = [d.new_group([0, 1]), d.new_group([2, 3])][r // 2]
dp = [d.new_group([0, 2]), d.new_group([1, 3])][r % 2]
t = torch.ones(4)
d.all_reduce(t, group=tp)
try:  # BUGS.md bug 2: the group-local root 0 passed as torch's global src
    d.broadcast_object_list([r], src=0, group=tp)
except (RuntimeError, ValueError):
    pass
d.barrier()
'''


# faults whose detail (and which replica loses) is a socket race on one
# build too: only the exit status and the mechanisms found are compared
RACY = ('inject-opid-seeded', 'inject-shm-name-no-group', 'inject-world-workspace')


def racy_summary(code, out):
    try:
        rep = json.loads(out)
        mech = sorted({c.get('mechanism', '') for r in rep['replicas'] for c in r['checks']
                       if c['status'] == 'fail'})
    except (ValueError, KeyError, TypeError):
        mech = ['unreadable report']
    return f'exit {code}\nmechanisms failing: {mech}\n'


def run_all(b, tmp):
    res = {}
    for name, argv in jobs(b):
        env = dict(os.environ, TORCHELASTIC_ERROR_FILE=os.path.join(tmp, name + '.err'))
        env.pop('DPTP_AUDIT', None)
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
            text = f'exit {p.returncode}\n--- stdout\n{p.stdout}\n'
            if name in RACY:
                text = racy_summary(p.returncode, p.stdout)
            # which rank a failing dptp-check job's launcher sees end first
            # is a race: its report is compared for the jobs built for it
            if not (name.startswith(('inject-', 'layouts')) and p.returncode):
                text += f'--- stderr\n{p.stderr}'
        except subprocess.TimeoutExpired:
            text = 'TIMEOUT'
        errf = env['TORCHELASTIC_ERROR_FILE']
        if os.path.exists(errf):
            with open(errf) as f:
                text += '\n--- error file\n' + f.read()
            os.unlink(errf)
        res[name] = mask(text.replace(b, 'BUILD'))
    for page in ('dptp-run.1', 'dptp-check.1'):
        p = os.path.join(b, 'man', page)
        if os.path.exists(p):
            with open(p) as f:
                res['man-' + page] = f.read()
    return res


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2])
    base, new = (os.path.abspath(a) for a in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as tmp:
        a, b = run_all(base, tmp), run_all(new, tmp)
    bad = 0
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            bad += 1
            sys.stdout.writelines(difflib.unified_diff(
                (a.get(k) or '').splitlines(True), (b.get(k) or '').splitlines(True),
                f'base/{k}', f'new/{k}'))
    print(f'compare-runs: {len(set(a) | set(b))} runs, {bad} differ')
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
