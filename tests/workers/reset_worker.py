"""Under ``tfstrategy launch``: a Keras fit, ``tfstrategy.reset()``, a second fit (issue 46, item 5).

Prints one JSON line: the progress file's batch count after each fit, the supervision steps armed
before and after the reset, and the ledger the heartbeat wrote for the second fit (the launcher
deletes its workers' files when the job ends, so the worker reads them itself).
"""

from __future__ import annotations

import json
import time
from typing import Any


def fit(keras: Any, np: Any, batches: int) -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rows = np.zeros((4 * batches, 2), "float32")
    model.fit(rows, rows[:, :1], batch_size=4, epochs=1, verbose=0)


def main() -> None:
    import keras
    import numpy as np

    import tfstrategy
    from tfstrategy.contract.ledger import read_ledger
    from tfstrategy.contract.reports import read_progress
    from tfstrategy.runtime.ledger import current_keeper
    from tfstrategy.state.registry import RUNTIME

    progress = RUNTIME.progress[0].path
    armed = sorted(RUNTIME.supervision)
    fit(keras, np, 4)
    first = read_progress(progress).steps
    tfstrategy.reset()
    rearmed = sorted(RUNTIME.supervision)
    fit(keras, np, 3)
    second = read_progress(progress).steps
    keeper = current_keeper()
    ledger = None
    while keeper is not None and ((ledger := read_ledger(keeper.path)) is None or ledger.total_steps < 3):
        time.sleep(0.1)  # the heartbeat writes it within a second (the test's own timeout bounds this)
    print(json.dumps({"first": first, "second": second, "armed": armed, "rearmed": rearmed,
                      "ledger": None if ledger is None else [ledger.total_steps, ledger.extra.get("loop")]}))


if __name__ == "__main__":
    main()
