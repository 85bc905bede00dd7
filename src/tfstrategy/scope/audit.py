"""Audit that a model, its optimizer and its metrics live in a strategy's scope.

The how-to's step 2 says to create the model, optimizer, metrics and any
restored checkpoint inside ``strategy.scope()``. TensorFlow 2.21 / Keras 3.15
fail confusingly or silently when that is not done (an Adam made outside:
"Mixing different tf.distribute.Strategy objects"; a plain SGD made outside:
``iterations`` counts once per replica; a model made outside: trains on one
device). :func:`audit_scope` lists every variable with its owner, whether it
was created in *this* strategy's scope and where (file:line, see
:mod:`tfstrategy.scope.creation_sites`); :func:`require_scope` raises :class:`ScopeError`
naming each offender; :func:`guard_model` and :func:`scope_guard` run it
before training.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import BuildError, ScopeError
from tfstrategy.scope.creation_sites import site_of
from tfstrategy.selection.names import strategy_name
from tfstrategy.state.registry import RUNTIME
from tfstrategy.training.precision import float16_output_message

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model, Optimizer, Strategy, StrategyOrSelection, Variable

__all__ = ["VariableRecord", "AuditReport", "strategy_of", "audit_scope", "require_scope", "guard_model", "scope_guard"]

MODEL, OPTIMIZER, METRIC = "model", "optimizer", "metric"

#: How to fix a stray variable, by owner.
FIXES = {
    MODEL: "build (or keras.models.load_model) the model inside `with strategy.scope():`",
    OPTIMIZER: (
        "create the optimizer inside the scope, or pass its name (optimizer='adam') to compile() inside the scope "
        "(build_in_scope also takes a function that makes it: optimizer=lambda: keras.optimizers.SGD(momentum=0.9))"
    ),
    METRIC: (
        "create metric objects inside the scope, or pass their names (metrics=['mae']) to compile() inside the scope"
    ),
}
#: Model methods :func:`guard_model` audits before Keras runs them.
GUARDED_METHODS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")


@dataclass(frozen=True)
class VariableRecord:
    """One variable: who owns it, whether it is in the scope, where it was made."""

    owner: str
    path: str
    shape: tuple[int | None, ...]
    in_scope: bool
    site: str | None

    def line(self) -> str:
        where = self.site or "site not recorded"
        return f"{self.owner:<9} {self.path:<40} {'in scope' if self.in_scope else 'OUTSIDE':<8} {where}"


@dataclass(frozen=True)
class AuditReport:
    """Every variable of a model, optimizer and metrics, checked against one strategy."""

    strategy: str
    replicas: int
    variables: tuple[VariableRecord, ...]
    problems: tuple[str, ...] = ()
    optimizer_built: bool | None = None
    seconds: float = field(default=0.0, compare=False)
    #: Findings that do not stop training (e.g. outputs handed to the loss in float16).
    advice: tuple[str, ...] = ()

    @property
    def offenders(self) -> list[VariableRecord]:
        return [record for record in self.variables if not record.in_scope]

    @property
    def passed(self) -> bool:
        return not self.offenders and not self.problems

    def _replicas(self) -> str:
        return f"{self.replicas} replica{'' if self.replicas == 1 else 's'}"

    def counts(self) -> dict[str, int]:
        """Variables per owner."""
        result = {MODEL: 0, OPTIMIZER: 0, METRIC: 0}
        for record in self.variables:
            result[record.owner] += 1
        return result

    def lines(self) -> list[str]:
        """A table of every variable, then the problems."""
        head = f"{len(self.variables)} variables, {len(self.offenders)} outside {self.strategy} ({self._replicas()})"
        return [head, *(record.line() for record in self.variables), *self.problems, *self.advice]

    def message(self, *, from_build_in_scope: bool = False) -> str:
        """What is wrong, which variables and where, and how to fix it.

        Args:
            from_build_in_scope: the audit ran inside :func:`tfstrategy.build_in_scope`,
                so the message does not advise calling it.
        """
        if self.passed:
            return f"All {len(self.variables)} variables were created in the scope of {self.strategy}."
        parts = []
        offenders = self.offenders
        if offenders:
            parts.append(
                f"{len(offenders)} of {len(self.variables)} variables were not created in the scope of "
                f"{self.strategy} ({self._replicas()}):"
            )
            groups: dict[tuple[str, str | None], list[str]] = {}
            for record in offenders:
                groups.setdefault((record.owner, record.site), []).append(record.path)
            for (owner, where), paths in groups.items():
                shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
                parts.append(f"  - {owner} variables created at {where or 'an unrecorded site'}: {shown}")
        parts.extend(f"  - {problem}" for problem in self.problems)
        owners = sorted({record.owner for record in offenders}, key=list(FIXES).index)
        fixes = "; ".join(FIXES[owner] for owner in owners) if owners else "see above"
        parts.append(
            f"Expected the model, optimizer and metrics to be created inside `with strategy.scope():`. "
            f"Fix: {fixes}" + ("." if from_build_in_scope else "; or build everything with tfstrategy.build_in_scope().")
        )
        return "\n".join(parts)


def strategy_of(strategy_or_selection: object) -> Any:
    """The ``tf.distribute.Strategy`` of a strategy or a :class:`tfstrategy.Selection`.

    A selection is known by what it holds (its ``strategy``), not by its class: the audit
    stands below ``select()`` and needs nothing of it.
    """
    strategy = strategy_or_selection
    held = getattr(strategy, "strategy", None)
    if held is not None and not hasattr(strategy, "extended"):
        strategy = held
    if not hasattr(strategy, "extended") or not hasattr(strategy, "scope"):
        raise BuildError(
            f"Received {type(strategy_or_selection).__name__}; expected a tf.distribute.Strategy or a "
            "tfstrategy.Selection (from tfstrategy.select())."
        )
    return strategy


def _owned_variables(model: Model, optimizer: Optimizer | None, metrics: Iterable[Any]) -> list[tuple[str, Any]]:
    owned: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def add(owner: str, variables: Iterable[object]) -> None:
        for variable in variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                owned.append((owner, variable))

    if model is not None:
        add(MODEL, model.weights)
        add(METRIC, _compat.model_metric_variables(model))
        add(METRIC, [v for metric in _compat.compiled_metric_objects(model) for v in metric.variables])
    if optimizer is not None:
        add(OPTIMIZER, _compat.optimizer_variables(optimizer))
    for metric in metrics:
        add(METRIC, metric.variables)
    return owned


def _nested_owners(model: Model, strategy: Strategy) -> dict[int, Any]:
    """Variable id -> the strategy of the nested model that made it, when ``model`` is used without a strategy.

    Keras' tutorials export a trained model by wrapping it, after training and
    outside any scope, with layers of its own (``Sequential([vectorize_layer,
    model, Activation("sigmoid")])``) and evaluate that without a strategy,
    which TensorFlow runs fine: the wrapped model's variables belong to the
    strategy it was built under, not to the default one. Under a real strategy a
    nested model of another strategy is a genuine mistake, so only the default
    strategy looks inside.
    """
    owners: dict[int, object] = {}
    if model is None or not _compat.is_default_strategy(strategy):
        return owners
    pending = list(getattr(model, "layers", ()))
    while pending:
        layer = pending.pop()
        nested = _compat.model_strategy(layer) if hasattr(layer, "layers") else None
        if nested is not None and not _compat.is_default_strategy(nested):
            for variable in layer.weights:
                owners.setdefault(id(variable), nested)
        pending.extend(getattr(layer, "layers", ()))
    return owners


def _in_scope(strategy: Strategy, variable: Variable) -> bool:
    # Asking about a Keras 3 variable itself raises AttributeError (measured on Keras 3.15).
    return bool(strategy.extended.variable_created_in_scope(_compat.tf_variable(variable)))


def _object_problems(strategy: Strategy, model: Model, optimizer: Optimizer | None, records: list[VariableRecord]) -> list[str]:
    problems = []
    stray_owners = {record.owner for record in records if not record.in_scope}
    name = strategy_name(strategy)
    if model is not None and MODEL not in stray_owners:
        owner = _compat.model_strategy(model)
        if (owner is None and not _compat.is_default_strategy(strategy)) or (owner is not None and owner is not strategy):
            problems.append(
                f"model {model.name!r} was created under {strategy_name(owner) if owner else 'no strategy'}, "
                f"not under {name}; {FIXES[MODEL]}"
            )
    if optimizer is not None and OPTIMIZER not in stray_owners:
        owner = _compat.optimizer_strategy(optimizer, strategy)
        if owner is not strategy and not (_compat.is_default_strategy(owner) and _compat.is_default_strategy(strategy)):
            problems.append(
                f"optimizer {type(optimizer).__name__} was created under {strategy_name(owner)}, not under {name}; "
                f"{FIXES[OPTIMIZER]}"
            )
    return problems


def audit_scope(
    model: Model,
    strategy: Any,
    *,
    optimizer: Optimizer | None = None,
    metrics: Iterable[object] = (),
    require_built_optimizer: bool = False,
) -> AuditReport:
    """List every model, optimizer and metric variable and check it against ``strategy``.

    Args:
        model: a Keras model (its optimizer and compiled metrics are included).
        strategy: a ``tf.distribute.Strategy`` or a :class:`tfstrategy.Selection`.
        optimizer: an optimizer used without ``compile`` (custom training loops).
        metrics: metric objects used without ``compile``.
        require_built_optimizer: also flag an optimizer without its slot
            variables; a custom loop would create them lazily inside
            ``strategy.run``, which fails with several replicas.

    Example:
        >>> report = tfstrategy.audit_scope(model, selection)
        >>> report.passed, report.counts()
        (True, {'model': 2, 'optimizer': 6, 'metric': 4})
    """
    started = time.perf_counter()
    strategy = strategy_of(strategy)
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    nested = _nested_owners(model, strategy)
    records = [
        VariableRecord(
            owner=owner,
            path=_compat.variable_path(variable),
            shape=tuple(variable.shape),
            in_scope=_in_scope(nested.get(id(variable), strategy), variable),
            site=site_of(variable),
        )
        for owner, variable in _owned_variables(model, optimizer, metrics)
    ]
    problems = _object_problems(strategy, model, optimizer, records)
    built = None if optimizer is None else _compat.optimizer_built(optimizer)
    if require_built_optimizer and built is False:
        problems.append(
            f"optimizer {type(optimizer).__name__} has no slot variables yet; a custom training loop would create "
            f"them lazily inside strategy.run, which fails on several replicas. Call "
            f"optimizer.build(model.trainable_variables) inside the scope (tfstrategy.build_in_scope does)."
        )
    half_outputs = float16_output_message(model)
    return AuditReport(
        strategy=strategy_name(strategy),
        replicas=int(strategy.num_replicas_in_sync),
        variables=tuple(records),
        problems=tuple(problems),
        optimizer_built=built,
        seconds=time.perf_counter() - started,
        advice=(half_outputs,) if half_outputs else (),
    )


def require_scope(model: Model, strategy: Strategy, *, from_build_in_scope: bool = False, **audit_args: Any) -> AuditReport:
    """Audit like :func:`audit_scope` and raise if anything is outside the scope.

    Raises:
        ScopeError: naming each offending variable, its owner and file:line.
    """
    report = audit_scope(model, strategy, **audit_args)
    if not report.passed:
        raise ScopeError(report.message(from_build_in_scope=from_build_in_scope))
    return report


def _audit_key(model: Model) -> tuple[int, ...]:
    optimizer = getattr(model, "optimizer", None)
    return (
        id(optimizer),
        len(model.weights),
        len(optimizer.variables) if optimizer is not None else -1,
        len(getattr(model, "metrics_variables", ())),
    )


def guard_model(model: Model, strategy: Any) -> Any:
    """Make ``model.fit`` (evaluate, predict, ``*_on_batch``) audit the scope first.

    The audit runs before Keras builds anything, so a stray optimizer gives a
    :class:`ScopeError` naming its variables instead of "Mixing different
    tf.distribute.Strategy objects". It is repeated only when the optimizer
    or the number of variables changed since the last passing audit.

    Returns:
        The same model, guarded.
    """
    # Imported here, not at module level: `tfstrategy check` audits but never fits.
    from tfstrategy.training.datasets import refuse_endless_fit

    strategy = strategy_of(strategy)
    passed: dict[str, tuple[int, ...]] = {}

    def wrap(method: Any) -> object:
        @functools.wraps(method)
        def guarded(*args: object, **kwargs: object) -> object:
            if method.__name__ == "fit":
                refuse_endless_fit(args, kwargs)
            key = _audit_key(model)
            if passed.get("key") != key:
                report = require_scope(model, strategy)
                passed["key"] = key
                for advice in report.advice:
                    warnings.warn(f"tfstrategy: {advice}", RuntimeWarning, stacklevel=2)
            return method(*args, **kwargs)

        guarded.__tfstrategy_guard__ = True  # type: ignore[attr-defined]
        return guarded

    for name in GUARDED_METHODS:
        method = getattr(model, name)
        if not getattr(method, "__tfstrategy_guard__", False):
            # An instance attribute Keras does not track, registered so tfstrategy.reset() takes it off.
            RUNTIME.override_attribute(model, name, wrap(method), name=f"scope_guard:{name}:{id(model)}",
                                       note=f"{name} audits the scope first (scope_guard)")
    return model


@functools.lru_cache(maxsize=1)
def _scope_guard_class() -> type:
    keras = tf().keras

    class ScopeGuard(keras.callbacks.Callback):  # type: ignore[name-defined]  # an untyped Keras class
        """Keras callback: audit the scope when training, evaluation or prediction begins."""

        def __init__(self, strategy: StrategyOrSelection) -> None:
            super().__init__()
            self.strategy = strategy_of(strategy)
            self.report: AuditReport | None = None

        def _audit(self, logs: Logs = None) -> None:
            self.report = require_scope(self.model, self.strategy)

        on_train_begin = _audit
        on_test_begin = _audit
        on_predict_begin = _audit

    return ScopeGuard


def scope_guard(strategy: StrategyOrSelection) -> Any:
    """A Keras callback that raises :class:`ScopeError` when ``fit`` begins on a badly scoped model.

    Keras builds a compiled optimizer before callbacks run, so an optimizer
    made outside the scope fails in Keras first; :func:`guard_model` (applied
    by :func:`tfstrategy.build_in_scope`) audits before that.

    Example:
        >>> model.fit(x, y, callbacks=[tfstrategy.scope_guard(selection)])
    """
    return _scope_guard_class()(strategy)
