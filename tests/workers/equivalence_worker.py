"""Run cells of the equivalence matrix on the script's own ``MirroredStrategy()``; print their results as JSON.

An unchanged script to ``tfstrategy run`` or ``tfstrategy launch``: ``tfstrategy run --cpu-replicas 2 -- python
tests/workers/equivalence_worker.py entry:fit entry:predict`` gives ``MirroredStrategy()`` the 2 logical CPUs;
under ``tfstrategy launch -n 2`` the same ``MirroredStrategy()`` joins the 2 workers (one replica each). The
last line of stdout is ``EQUIVALENCE {json}``: the replica counts (the job's, this process's) and, per cell, its results
(tests/equivalence/matrix_cells.py) or the error it raised. ``--out FILE`` (before the cells) also writes that
JSON to FILE, from the chief only (task 0 of ``TF_CONFIG``, or the only process).
"""

import json
import os
import sys
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "equivalence"))
import matrix_cells  # noqa: E402

arguments = sys.argv[1:]
out = None
if arguments[:1] == ["--out"]:
    out, arguments = Path(arguments[1]), arguments[2:]
strategy = tf.distribute.MirroredStrategy()
# The replicas of this process: 2 under `run --cpu-replicas 2`, 1 on each of 2 workers under `launch -n 2`.
results: dict[str, object] = {"replicas": strategy.num_replicas_in_sync,
                              "local_replicas": len(strategy.extended.worker_devices)}
for cell_id in arguments:
    try:
        results[cell_id] = matrix_cells.to_json(matrix_cells.cell(cell_id).driver(strategy))
    except Exception as error:  # one failing cell must not hide the others' results
        results[cell_id] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
text = json.dumps(results)
print("EQUIVALENCE " + text)
if out is not None and json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("index", 0) == 0:
    out.write_text(text)
