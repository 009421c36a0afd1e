# A Python worker without torch that starts a subprocess: the subprocess
# must not inherit the recorders (environment, PYTHONPATH, LD_PRELOAD).
import json
import os
import subprocess
import sys

out = subprocess.run([sys.executable, "-c",
                      "import os, sys, json; print(json.dumps({k: os.environ.get(k) for k in "
                      "('PYTHONPATH', 'LD_PRELOAD', 'DPTP_AUDIT_DIR', 'DPTP_AUDIT_PPID')}));"
                      "print(json.dumps('dptp_audit_rec' in sys.modules))"],
                     capture_output=True, text=True, check=True).stdout.split("\n")
print("CHILD-ENV", out[0], "CHILD-REC", out[1], flush=True)
