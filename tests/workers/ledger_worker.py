"""A worker without TensorFlow that writes its ledger as a training worker would (the launcher's side of issue 38).

It joins, then writes 40 readings of its ledger, one every 0.1 s, and exits 0. ``straggler``: worker 1
waits 0.10 s a step for its input, its peers 2 ms; ``healthy``: every worker 2 ms, with jitter.
"""

from __future__ import annotations

import os
import random
import sys
import time

from tfstrategy.launch.ledger import Ledger, ledger_path, write_ledger
from tfstrategy.multiworker.worker_protocol import signal_joined
from tfstrategy.worker_contract import WorkerContract

mode = sys.argv[1]
contract = WorkerContract.from_environ(os.environ)
if contract.join_file is None or contract.index is None:
    sys.exit("run me under tfstrategy launch")
# The start-up hook took the progress file's variable (a child must not reset it); the launcher keeps
# it beside the join file.
progress_file = contract.join_file.with_suffix(".progress")
signal_joined()
slow = mode == "straggler" and contract.index == 1
for step in range(1, 41):
    wait = 0.10 if slow else 0.002 * random.uniform(0.5, 1.5)
    write_ledger(ledger_path(progress_file), Ledger(
        epoch=0, batches=step, steps=step, total_steps=step, step_seconds=0.2, input_seconds=wait,
        cpu_seconds=0.05 * random.uniform(0.9, 1.1), time=time.time()))
    time.sleep(0.1)
print(f"worker {contract.index} wrote 40 readings", flush=True)
