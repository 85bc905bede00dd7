"""A worker without TensorFlow for the launcher's supervision tests (starts in milliseconds).

Each worker first starts a child (``sleep``) so the tests can check that nothing survives.
``fail``: worker 1 prints 30 lines and exits 3, the others wait. ``sleep``: every worker waits.
``joined``: worker 0 signals that it joined; worker 1 never does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

mode = sys.argv[1]
index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])
subprocess.Popen(["sleep", "600"])
print(f"ready {os.environ['TF_CONFIG']}", flush=True)
if mode == "fail" and index == 1:
    for line in range(30):
        print(f"line {line}", flush=True)
    sys.exit(3)
if mode == "joined" and index == 0:
    from tfstrategy.worker import signal_joined

    signal_joined()
time.sleep(600)
