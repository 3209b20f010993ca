"""A task that leaves a child no process-group or environment sweep can find: the child
forks, starts a session of its own (``setsid``) and execs a sleeper with an EMPTY
environment. Its pid goes to ``<hints>/escapee.pid`` first; its command line carries a
token so a test can find it from outside any pid namespace the task runs in.

Usage: escapee_task.py <token> <hints dir> [metrics]   (metrics: exit 0 with a result at once)
"""

import json
import os
import sys
import time

token, hints = sys.argv[1], sys.argv[2]
finish = len(sys.argv) > 3 and sys.argv[3] == "metrics"
child = os.fork()
if child == 0:
    os.setsid()
    with open(os.path.join(hints, "escapee.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    os.execve(sys.executable, [sys.executable, "-c", f"import time; time.sleep(600)  # escapee {token}"], {})
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(hints, "escapee.pid")) and time.monotonic() < deadline:
    time.sleep(0.01)
out = os.environ.get("FLASHML_OUTPUT_DIR")
if finish:
    if out:
        with open(os.path.join(out, "metrics.json"), "w") as handle:
            json.dump({"ok": 1}, handle)
    sys.exit(0)
time.sleep(600)
