"""Run cells of the equivalence matrix on the script's own ``MirroredStrategy()``; print their results as JSON.

An unchanged script to ``tfstrategy run``: ``tfstrategy run --cpu-replicas 2 -- python
tests/workers/equivalence_worker.py entry:fit entry:predict`` gives ``MirroredStrategy()`` the 2
logical CPUs. The last line of stdout is ``EQUIVALENCE {json}``: the replica count and, per cell,
its results (tests/equivalence/matrix_cells.py) or the error it raised.
"""

import json
import sys
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "equivalence"))
import matrix_cells  # noqa: E402

strategy = tf.distribute.MirroredStrategy()
results: dict[str, object] = {"replicas": strategy.num_replicas_in_sync}
for cell_id in sys.argv[1:]:
    try:
        results[cell_id] = matrix_cells.to_json(matrix_cells.cell(cell_id).driver(strategy))
    except Exception as error:  # one failing cell must not hide the others' results
        results[cell_id] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
print("EQUIVALENCE " + json.dumps(results))
