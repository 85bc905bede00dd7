"""A tiny Keras training script for the multi-worker tests, run under `tfstrategy launch`.

Every worker writes ``<out>/worker-<i>.json`` (history, final weights, steps).
Fault injection for the supervision tests (first start only, ``TFSTRATEGY_RESTART=0``):
``--kill-at EPOCH:BATCH`` SIGKILLs worker 1 there; ``--steal-port`` makes worker 0 occupy
worker 1's port before worker 1 starts.
``--faults POINT@WORKER[:STEP],...`` kills one worker in its save on every start of a
``--max-restarts`` job, one fault per start (see :func:`arm_fault`), so one job runs several
kills; each start writes ``<out>/attempt-<restart>-worker-<i>.json`` (the step it resumed from,
the fault it armed).
``--preemption`` takes ``preemption_callbacks()`` (SIGTERM: every worker stops at one step, exit 75)
instead of ``backup_callbacks()``; ``--hold-for-sigterm EPOCH`` makes every worker of a start that
resumed nothing wait at the beginning of that epoch until it got SIGTERM (it prints ``holding for
SIGTERM``), so a test signals a job mid-training at a known point, whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

EXAMPLES, FEATURES, GLOBAL_BATCH = 256, 4, 32
STEPS_PER_EPOCH = EXAMPLES // GLOBAL_BATCH


def parse_faults(text: str | None) -> list[tuple[str, int, int | None]]:
    """``POINT@WORKER[:STEP],...``: the fault of each start (restart 0, 1, ...) of the job."""
    faults = []
    for item in (text or "").split(","):
        if item:
            point, _, where = item.partition("@")
            worker, _, step = where.partition(":")
            faults.append((point, int(worker), int(step) if step else None))
    return faults


def arm_fault(backup, faults, attempt: int, resumed, every: int, out: Path, index: int):
    """Arm this start's fault on ``backup`` (a ``CoordinatedBackup``) after it resumed from ``resumed``; record both.

    ``TFSTRATEGY_TEST_BACKUP_FAULT`` kills on a job's first start only; a chain of kills in one job
    sets the same test-only fault the variable sets, ``(point, worker, step)``, on each start. The
    step, unless given, is the save after the resumed one, but never the job's first save (a kill
    then always has a committed step before it): ``max(resumed, every) + every``.
    """
    fault = None
    if attempt < len(faults):
        point, worker, step = faults[attempt]
        fault = (point, worker, step if step is not None else max(resumed.step, every) + every)
        if not hasattr(backup, "_fault"):
            raise RuntimeError("CoordinatedBackup has no _fault (point, worker, step) any more: update arm_fault")
        backup._fault = fault
    record = {"resumed": vars(resumed), "fault": fault}
    (out / f"attempt-{attempt}-worker-{index}.json").write_text(json.dumps(record))
    return fault


def make_data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
    return x, y


def make_dataset():
    import tensorflow as tf

    x, y = make_data()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def train(strategy, epochs: int, callbacks=()):
    """Build, compile and fit the model under ``strategy``; returns (model, history)."""
    import keras

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    history = model.fit(make_dataset(), epochs=epochs, callbacks=list(callbacks), shuffle=False, verbose=0)
    return model, history


class _Attempt:
    """After the backup callback resumed (``on_train_begin``): record the resumed step, arm ``--faults``."""

    def __init__(self, backup_callback, faults, every: int, attempt: int, out: Path, index: int) -> None:
        import keras

        class AttemptCallback(keras.callbacks.Callback):
            def on_train_begin(cb, logs=None):
                arm_fault(backup_callback.backup, faults, attempt, backup_callback.resumed, every, out, index)

        self.callback = AttemptCallback()


class _HoldForSigterm:
    """``--hold-for-sigterm``: from ``on_train_begin``, note SIGTERM (then pass it on); wait for it at ``epoch``."""

    def __init__(self, epoch: int, backup_callback) -> None:
        import keras

        class HoldCallback(keras.callbacks.Callback):
            def on_train_begin(cb, logs=None):
                cb.got = backup_callback is not None and backup_callback.resumed.step > 0  # a resumed start goes on
                previous = signal.getsignal(signal.SIGTERM)  # the preemption callback's

                def noted(signum, frame):
                    cb.got = True
                    if callable(previous):
                        previous(signum, frame)

                if not cb.got:
                    signal.signal(signal.SIGTERM, noted)

            def on_epoch_begin(cb, e, logs=None):
                if e == epoch and not cb.got:
                    print(f"holding for SIGTERM at epoch {e}", flush=True)
                    while not cb.got:
                        time.sleep(0.02)

        self.callback = HoldCallback()


class _KillAt:
    def __init__(self, epoch: int, batch: int) -> None:
        import keras

        class KillCallback(keras.callbacks.Callback):
            def on_epoch_begin(cb, e, logs=None):
                cb.epoch = e

            def on_train_batch_end(cb, b, logs=None):
                if cb.epoch == epoch and b == batch:
                    print(f"killing myself at epoch {epoch} batch {batch}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        self.callback = KillCallback()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at", default=None, help="EPOCH:BATCH at which worker 1 SIGKILLs itself")
    parser.add_argument("--steal-port", action="store_true", help="worker 0 takes worker 1's port")
    parser.add_argument("--save-freq", default="epoch", help="backup_callbacks(save_freq=...): 'epoch' or batches")
    parser.add_argument("--keep-backup", action="store_true", help="backup_callbacks(delete_checkpoint=False)")
    parser.add_argument("--faults", default=None, help="POINT@WORKER[:STEP],...: a kill in a save on each start")
    parser.add_argument("--preemption", action="store_true", help="preemption_callbacks() instead of backup_callbacks()")
    parser.add_argument("--hold-for-sigterm", type=int, default=None, metavar="EPOCH",
                        help="a start that resumed nothing waits at EPOCH's beginning until it got SIGTERM")
    args = parser.parse_args()
    index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])
    first_start = os.environ.get("TFSTRATEGY_RESTART", "0") == "0"
    stolen = args.out / "port-stolen"
    if args.steal_port:
        if index == 0:
            port = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][1].rsplit(":", 1)[1]
            thief = socket.socket()
            thief.bind(("127.0.0.1", int(port)))
            thief.listen()
            stolen.write_text(port)
            print(f"holding worker 1's port {port}", flush=True)
            time.sleep(600)
        while not stolen.exists():
            time.sleep(0.05)

    import tfstrategy

    selection = tfstrategy.select()
    print(f"strategy {type(selection.strategy).__name__} replicas {selection.num_replicas}", flush=True)
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    make = tfstrategy.preemption_callbacks if args.preemption else tfstrategy.backup_callbacks
    callbacks = make(save_freq=save_freq, delete_checkpoint=not args.keep_backup)
    backup = callbacks[0] if callbacks else None
    if args.hold_for_sigterm is not None:
        callbacks.append(_HoldForSigterm(args.hold_for_sigterm, backup).callback)
    if args.faults:
        attempt = int(os.environ.get("TFSTRATEGY_RESTART", "0"))
        every = STEPS_PER_EPOCH if save_freq == "epoch" else save_freq
        callbacks.append(_Attempt(backup, parse_faults(args.faults), every, attempt, args.out, index).callback)
    if args.kill_at and index == 1 and first_start:
        epoch, batch = (int(v) for v in args.kill_at.split(":"))
        callbacks.append(_KillAt(epoch, batch).callback)
    model, history = train(selection.strategy, args.epochs, callbacks)
    saved = tfstrategy.save_model(model, args.out / "model.keras")
    result = {
        "restart": int(os.environ.get("TFSTRATEGY_RESTART", "0")),
        "history": history.history,
        "steps": int(model.optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
        "saved": None if saved is None else str(saved),
        "resumed": None if backup is None else vars(backup.resumed),
    }
    (args.out / f"worker-{index}.json").write_text(json.dumps(result))
    print(f"done: loss {history.history['loss'][-1]:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
