"""Training functions the Ray tests hand to ``TensorflowTrainer`` (imported by reference in Ray's workers).

Each worker writes ``<out>/<job>/start-<a>-rank-<r>.json`` once prepared (where it resumed from and
its weights then) and, at the end, ``<out>/<job>/attempt-<a>-rank-<r>.json``: what tfstrategy
selected, where it resumed from, the losses, the final weights, Ray's ``TF_CONFIG`` and the sockets
listening at the end of training. Fault injection, once Ray has registered epoch 1's checkpoint:
``fail`` is a comma-separated list of faults, the n-th fired in the n-th attempt (so a job needs
``max_failures`` of at least their number): ``kill`` SIGKILLs rank 1 in the middle of epoch 2;
``kill-before-report`` SIGKILLs rank 1 at the end of epoch 2, after training it and before reporting
it (so the chief reports a checkpoint for epoch 2 that must not count); ``term`` sends SIGTERM to rank
1's own process in the middle of epoch 2 (Ray's worker does not act on it while it trains; the
chief's next collective times out). Each fault writes ``<out>/<job>/fault-fired-<kind>``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

EXAMPLES, FEATURES, GLOBAL_BATCH, EPOCHS = 256, 4, 32, 3


def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
    return x, y


def build_model():
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


def _listeners() -> list[str]:
    """Local addresses of every listening TCP socket in this network namespace (from /proc)."""
    found = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            address, port = fields[1].split(":")
            found.append(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hexed: str, width: int) -> str:
    import ipaddress

    raw = bytes.fromhex(hexed)
    # /proc prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def committed_epochs(storage: Path) -> list[int]:
    """Epochs whose checkpoint Ray's controller registered (its snapshot in the run's storage)."""
    try:
        snapshot = json.loads((storage / "checkpoint_manager_snapshot.json").read_text())
    except (OSError, ValueError):
        return []
    return [result["metrics"].get("epoch") for result in snapshot.get("checkpoint_results", [])]


class _Fault:
    """This attempt's fault: the first of ``kinds`` (comma-separated) that has not fired yet, if any."""

    def __init__(self, kinds: str, rank: int, out: Path, storage: Path) -> None:
        pending = [kind for kind in kinds.split(",") if kind and not (out / f"fault-fired-{kind}").exists()]
        self.kind = pending[0] if pending else ""
        self.rank, self.marker, self.storage = rank, out / f"fault-fired-{self.kind}", storage

    def armed(self) -> bool:
        return bool(self.kind) and self.rank == 1 and not self.marker.exists()

    def fire(self, where: str) -> None:
        # Ray registers a reported checkpoint when its controller next polls the workers; until then a
        # failure loses it. Fault at the worst moment after epoch 1 is committed, not in that window.
        began = time.monotonic()
        while 1 not in committed_epochs(self.storage) and time.monotonic() < began + 600:
            time.sleep(0.2)
        # Its peers wait as long in their next collective: the "term" fault's collective timeout must outlast
        # this wait, or the timeout, not the SIGTERM, fails the attempt.
        self.marker.write_text(f"{where}; committed before: {committed_epochs(self.storage)}; "
                               f"waited {time.monotonic() - began:.1f} s for it")
        print(f"fault {self.kind} at {where}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM if self.kind == "term" else signal.SIGKILL)
        time.sleep(600)  # SIGTERM: Ray's handler ends the process; never train on


def _fault_callback(fault: _Fault):
    import tensorflow as tf

    class Fault(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if fault.kind in ("kill", "term") and fault.armed() and self.epoch == 1 and batch == 3:
                fault.fire("epoch 2 batch 4")

        def on_epoch_end(self, epoch, logs=None):
            if fault.kind == "kill-before-report" and fault.armed() and epoch == 1:
                fault.fire("end of epoch 2, before reporting it")

    return Fault()


def train_fn(config: dict) -> None:
    """Keras fit (``config["loop"]`` False) or tfstrategy's custom-loop step, reporting every epoch."""
    import sys

    tensorflow_imported = "tensorflow" in sys.modules  # by Ray, before this function runs
    import ray.train
    import tensorflow as tf

    from tfstrategy.integrations import ray as tfs_ray

    started = time.time()
    context = ray.train.get_context()
    rank = context.get_world_rank()
    out = Path(config["out"])
    attempt = len(list(out.glob(f"started-rank-{rank}-*")))
    fault = _Fault(config.get("fail", ""), rank, out, Path(config["storage"]))
    (out / f"started-rank-{rank}-{attempt}").write_text(str(started))
    record: dict = {
        "rank": rank, "attempt": attempt, "started": started,
        "thread": threading.current_thread().name,
        "tf_use_legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tf_config": json.loads(os.environ.get("TF_CONFIG", "null")),
        "tensorflow_imported": tensorflow_imported,
    }
    from tfstrategy import _compat

    record["runtime_started_before_prepare"] = _compat.runtime_started()
    run = tfs_ray.prepare(
        build_model, optimizer=lambda: tf.keras.optimizers.Adam(0.01), loss="mse",
        collective_timeout=config.get("collective_timeout"),
    )
    record.update(
        strategy=type(run.strategy).__name__, replicas=run.selection.num_replicas, explain=run.selection.explain(verbose=True),
        patches=[status.name for status in run.selection.patches if status.installed],
        initial_epoch=run.initial_epoch, resumed_from=run.resumed_from,
        start_weights=[w.tolist() for w in run.model.get_weights()],
    )
    # Written before any fault of this attempt: an attempt that a fault ends still says where it resumed from.
    (out / f"start-{attempt}-rank-{rank}.json").write_text(json.dumps(
        {key: record[key] for key in ("initial_epoch", "resumed_from", "start_weights")}))
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    import tfstrategy

    losses: list[float] = []
    if config.get("loop"):
        step = tfstrategy.make_train_step(run.model, strategy=run.selection, global_batch=GLOBAL_BATCH, loss="mse")
        batches = tfstrategy.prepare_dataset(dataset, run.selection, global_batch=GLOBAL_BATCH)
        distributed = run.strategy.experimental_distribute_dataset(batches)
        for epoch in range(run.initial_epoch, EPOCHS):
            total, count = 0.0, 0
            for index, batch in enumerate(distributed):
                logs = step(batch)
                total, count = total + float(logs["loss"]), count + 1
                if fault.kind in ("kill", "term") and fault.armed() and epoch == 1 and index == 3:
                    fault.fire("epoch 2 batch 4")
            losses.append(total / count)
            if fault.kind == "kill-before-report" and fault.armed() and epoch == 1:
                fault.fire("end of epoch 2, before reporting it")
            run.report(epoch + 1, {"loss": losses[-1]})
    else:
        batches = tfstrategy.prepare_dataset(dataset, run.selection, global_batch=GLOBAL_BATCH)
        history = run.model.fit(
            batches, epochs=EPOCHS, initial_epoch=run.initial_epoch, shuffle=False, verbose=0,
            callbacks=[_fault_callback(fault), run.callback()],
        )
        losses = [float(v) for v in history.history.get("loss", [])]
    record.update(
        losses=losses, steps=int(run.model.optimizer.iterations.numpy()),
        weights=[w.tolist() for w in run.model.get_weights()], listeners=_listeners(), finished=time.time(),
    )
    target = out / f"attempt-{attempt}-rank-{rank}.json"
    target.write_text(json.dumps(record))
