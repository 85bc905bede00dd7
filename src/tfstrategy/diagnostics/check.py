"""The strategy check: the how-to's ``strategy-demo.py``, packaged and extended.

:func:`run_check` builds the seed's model inside the selected strategy's scope,
trains one batch and then goes further: it lists the devices, checks every
variable was created in the scope, all-reduces across replicas and splits a
global batch. ``tfstrategy check`` prints the result; tests import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfstrategy._tf import tf
from tfstrategy.runtime.select import Selection, select
from tfstrategy.scope.audit import audit_scope
from tfstrategy.selection.names import strategy_name

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

#: The seed's smoke-test batch; rounded up to a multiple of the replicas.
SEED_BATCH = 8


@dataclass(frozen=True)
class CheckItem:
    """One ``key value`` line; ``ok`` is ``None`` for lines that only inform.

    ``value`` is what ``--json`` prints, typed (numbers, booleans, lists, objects); ``text`` is the
    line's value for people when it is not ``value`` itself (a list prints comma-separated).
    """

    key: str
    value: Any
    ok: bool | None = None
    text: str | None = None

    def line(self) -> str:
        if self.text is not None:
            return f"{self.key} {self.text}"
        if isinstance(self.value, list):
            return f"{self.key} {','.join(str(part) for part in self.value)}"
        return f"{self.key} {self.value}"


@dataclass
class CheckReport:
    """Every line of a check, in print order."""

    items: list[CheckItem] = field(default_factory=list)

    def add(self, key: str, value: object, ok: bool | None = None, *, text: str | None = None) -> None:
        self.items.append(CheckItem(key, value, ok, text))

    @property
    def passed(self) -> bool:
        return all(item.ok is not False for item in self.items)

    @property
    def failures(self) -> list[str]:
        return [item.key for item in self.items if item.ok is False]

    def lines(self) -> list[str]:
        return [item.line() for item in self.items]

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict, typed: each key's value, then ``passed`` and ``failed``.

        docs/reference/check-json.md and its schema, docs/reference/check.schema.json, list the keys.
        """
        result: dict[str, object] = {item.key: item.value for item in self.items}
        result["passed"] = self.passed
        result["failed"] = self.failures
        return result


def _short(device: str) -> str:
    # "/job:localhost/replica:0/task:0/device:CPU:1" -> "/cpu:1"
    kind, index = device.rsplit("device:", 1)[-1].split(":")
    return f"/{kind.lower()}:{index}"


def _variables_in_scope(strategy: Strategy, model: Model) -> tuple[bool, int]:
    """The scope audit of the model, its optimizer and metrics: (passed, variable count)."""
    report = audit_scope(model, strategy)
    return report.passed, len(report.variables)


def _all_reduce(strategy: Strategy) -> tuple[bool, float]:
    """Sum ``replica_id + 1`` over replicas; expected ``n (n + 1) / 2``."""
    tf_ = tf()

    # One value per replica without tracing a function (strategy.run would): the
    # check's CPU time is mostly start-up, and this keeps it near the demo's.
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: tf_.constant(context.replica_id_in_sync_group + 1.0)
    )
    total = float(strategy.reduce(tf_.distribute.ReduceOp.SUM, per_replica, axis=None))
    replicas = strategy.num_replicas_in_sync
    expected = replicas * (replicas + 1) / 2
    return math.isclose(total, expected), total


def _batch_split(strategy: Strategy, global_batch: int) -> tuple[bool, list[int]]:
    """Distribute one global batch and read each replica's share."""
    tf_ = tf()
    dataset = tf_.data.Dataset.from_tensor_slices(tf_.ones((global_batch, 4))).batch(global_batch)
    options = tf_.data.Options()
    options.experimental_distribute.auto_shard_policy = tf_.data.experimental.AutoShardPolicy.DATA
    batch = next(iter(strategy.experimental_distribute_dataset(dataset.with_options(options))))
    sizes = [int(part.shape[0]) for part in strategy.experimental_local_results(batch)]
    expected = global_batch // strategy.num_replicas_in_sync
    return all(size == expected for size in sizes), sizes


def run_check(selection: Selection | None = None, **select_args: Any) -> CheckReport:
    """Run the strategy check and return its report.

    The first four lines are exactly those of the how-to's ``strategy-demo.py``:
    ``strategy``, ``replicas``, ``model_strategy`` and ``train_on_batch``.

    Args:
        selection: a strategy from :func:`tfstrategy.select`; when omitted,
            one is selected from ``select_args`` (``strategy``, ``devices``,
            ``cpu_replicas``) and the environment.

    Example:
        >>> report = run_check(cpu_replicas=4)
        >>> report.passed, report.as_dict()["replicas"]
        (True, 4)
    """
    selection = selection or select(**select_args)
    strategy = selection.strategy
    keras = tf().keras
    replicas = strategy.num_replicas_in_sync
    global_batch = replicas * math.ceil(SEED_BATCH / replicas)

    with strategy.scope():
        inputs = keras.Input(shape=(4,))
        outputs = keras.layers.Dense(1)(inputs)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    logs = model.train_on_batch(tf().ones((global_batch, 4)), tf().ones((global_batch, 1)), return_dict=True)
    loss = float(logs["loss"])

    report = CheckReport()
    report.add("strategy", strategy_name(strategy))
    report.add("replicas", replicas)
    model_strategy = model.distribute_strategy is strategy
    report.add("model_strategy", model_strategy, model_strategy)
    trained = loss >= 0 and math.isfinite(loss)
    report.add("train_on_batch", trained, trained)
    report.add("devices", [_short(d) for d in strategy.extended.worker_devices])
    in_scope, count = _variables_in_scope(strategy, model)
    report.add("variables_in_scope", in_scope, in_scope)
    report.add("variables", count)
    reduced, total = _all_reduce(strategy)
    report.add("all_reduce", reduced, reduced)
    report.add("all_reduce_sum", total)
    report.add("global_batch", global_batch)
    report.add("per_replica_batch", global_batch // replicas)
    split_ok, sizes = _batch_split(strategy, global_batch)
    report.add("batch_split", split_ok, split_ok)
    report.add("replica_batches", sizes)
    report.add("chosen", selection.explain())
    return report
