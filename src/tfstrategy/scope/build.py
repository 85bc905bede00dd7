"""The how-to's step 2 in one call: build, compile, build the optimizer and restore, in scope.

:func:`build_in_scope` creates the model (from a ``build_model`` callable or a
``.keras`` file), compiles it, builds the optimizer so its slot variables exist,
and restores a checkpoint, all inside the strategy's scope, then audits the
result (:mod:`tfstrategy.scope.audit`) and guards ``fit``. Checkpoint reading lives
in :mod:`tfstrategy.scope.restore`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import BuildError, CheckpointError
from tfstrategy.scope.audit import AuditReport, guard_model, require_scope, strategy_of
from tfstrategy.scope.creation_sites import recording
from tfstrategy.scope.restore import RestoreReport, load_keras_model, restore_checkpoint
from tfstrategy.selection.names import strategy_name

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

ModelSource = Callable[[], Any] | str | os.PathLike[str]


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_in_scope` did: strategy, restore and the scope audit."""

    strategy: str
    replicas: int
    audit: AuditReport
    restore: RestoreReport | None
    #: An int, or "auto" (experimental): tuned at the model's first ``fit`` (``tfstrategy.tune_steps_per_execution``).
    steps_per_execution: int | str = 1

    def lines(self) -> list[str]:
        counts = self.audit.counts()
        lines = [
            f"strategy {self.strategy}",
            f"replicas {self.replicas}",
            f"variables_in_scope {self.audit.passed}",
            "variables " + ", ".join(f"{owner}={count}" for owner, count in counts.items()),
            f"optimizer_built {self.audit.optimizer_built}",
        ]
        if self.steps_per_execution == "auto":
            lines.append("steps_per_execution auto (experimental: tuned at the first fit)")
        if self.restore is None:
            lines.append("restored nothing")
        else:
            lines.extend(self.restore.lines())
        return lines


def _make_model(source: ModelSource, compile_args: dict[str, object]) -> tuple[Model, RestoreReport | None]:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.endswith(".keras"):
            raise BuildError(
                f"Received model={path!r}; expected a function that builds the model, or a path ending in .keras. "
                "Pass a .keras file (model.save('model.keras')), or build_model without parentheses."
            )
        return load_keras_model(path, compile=not compile_args)
    if not callable(source) or isinstance(source, tf().keras.Model):
        raise BuildError(
            f"Received model of type {type(source).__name__}; expected a function that builds and returns a Keras "
            "model (pass build_model, not build_model()), or a path to a .keras file. A model built before this call "
            "was built outside the scope."
        )
    model = source()
    if not isinstance(model, tf().keras.Model):
        raise BuildError(
            f"Received a build_model that returned {type(model).__name__}; expected it to return a keras.Model."
        )
    return model, None


#: Metric names Keras' compile() resolves from the loss, which ``keras.metrics.get`` does not know.
_COMPILE_METRIC_ALIASES = ("acc", "accuracy", "ce", "crossentropy")


def _names(value: object) -> list[str]:
    """The string identifiers in a compile argument (a name, or a list/dict of them, nested)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [name for item in value.values() for name in _names(item)]
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _names(item)]
    return []


def _check_identifiers(compile_args: dict[str, object]) -> None:
    """Refuse unknown loss/metric names now: Keras resolves them only at the first fit."""
    keras = tf().keras
    lookups = {"loss": keras.losses.get, "metrics": keras.metrics.get, "weighted_metrics": keras.metrics.get}
    for argument, lookup in lookups.items():
        for name in _names(compile_args.get(argument)):
            if argument != "loss" and name.lower() in _COMPILE_METRIC_ALIASES:
                continue
            try:
                found = lookup(name)
            except (ValueError, TypeError):
                found = None
            if found is None:
                _refuse_identifier(argument, name)


def _refuse_identifier(argument: str, name: str) -> None:
    kind, module, example = {
        "loss": ("loss", "losses", "'mse' or 'sparse_categorical_crossentropy'"),
        "optimizer": ("optimizer", "optimizers", "'adam' or 'sgd'"),
    }.get(argument, ("metric", "metrics", "'mae' or 'accuracy'"))
    raise BuildError(
        f"Received {argument}={name!r}; expected the name of a Keras {kind} (unchecked, an unknown one fails only "
        f"when training starts). Pass a Keras name such as {example}, or the object itself (keras.{module}.X())."
    ) from None


def _build_optimizer(model: Model) -> None:
    if getattr(model, "optimizer", None) is None:
        raise BuildError(
            f"Received model {model.name!r} that is not compiled and no compile arguments; expected e.g. "
            "optimizer='adam', loss='mse' (passed on to model.compile), or a build_model that compiles."
        )
    if not model.built or not model.trainable_variables:
        raise BuildError(
            f"Received model {model.name!r} with no variables yet; the optimizer's slots cannot be built for it. "
            "Give the model its input shape (keras.Input(shape=...)) or call model.build(shape) in build_model."
        )
    if not _compat.optimizer_built(model.optimizer):
        # Building now, in the scope, creates the slot variables before any
        # restore (else .weights.h5 drops the optimizer state with a warning)
        # and before a custom loop (else they are made lazily inside
        # strategy.run, which fails on several replicas).
        model.optimizer.build(model.trainable_variables)


def build_in_scope(
    strategy: Any,
    model: ModelSource,
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    guard: bool = True,
    **compile_args: Any,
) -> tuple[Any, BuildReport]:
    """Build, compile and restore a model inside the strategy's scope, then audit it.

    Args:
        strategy: a :class:`tfstrategy.Selection` or a ``tf.distribute.Strategy``.
        model: a function returning a Keras model (called inside the scope),
            or the path of a ``.keras`` file (loaded inside the scope, with its
            saved optimizer state unless compile arguments are given).
        checkpoint: restore this after the optimizer is built: a
            ``tf.train.Checkpoint`` directory or prefix (written with
            ``tf.train.Checkpoint(model=model, optimizer=model.optimizer)``),
            a ``.weights.h5`` or a ``.keras`` file.
        guard: make ``fit``/``evaluate``/``predict`` audit the scope first
            (:func:`tfstrategy.guard_model`).
        **compile_args: passed to ``model.compile`` inside the scope
            (``optimizer``, ``loss``, ``metrics``, ...). ``optimizer`` may
            also be a function that makes it (called inside the scope), e.g.
            ``optimizer=lambda: keras.optimizers.SGD(momentum=0.9)``.
            ``steps_per_execution="auto"`` (experimental, opt-in) compiles
            with 1 and, at the first ``fit``, measures the model on that
            fit's data and sets the K that pays
            (:func:`tfstrategy.tune_steps_per_execution`; the choice is
            printed unless ``verbose=0``). It runs real training steps
            before the fit and undoes them, which needs the no-trace
            machinery and the skipped build peek (an upstream crash); an
            int K (e.g. 32 on a small model) needs none of it.

    Returns:
        The compiled model (optimizer built, checkpoint restored) and a
        :class:`BuildReport`.

    Raises:
        BuildError: the model source or compile arguments are unusable
            (including a loss, optimizer or metric name Keras does not know).
        CheckpointError: the checkpoint is missing, unreadable or does not
            match; the model and optimizer are then left as they were.
        ScopeError: a variable was still created outside the scope (e.g. an
            optimizer object made before the call), named with its file:line.

    Example:
        >>> model, report = tfstrategy.build_in_scope(
        ...     selection, build_model, optimizer="adam", loss="mse", checkpoint="ckpts/")
        >>> report.restore.step
        120
    """
    strategy = strategy_of(strategy)
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise BuildError(
            f"Received checkpoint={checkpoint!r} ({type(checkpoint).__name__}); expected a path: a tf.train.Checkpoint "
            "directory or prefix, a .weights.h5 or a .keras file, e.g. checkpoint='ckpts/'."
        )
    steps_per_execution = compile_args.get("steps_per_execution", 1)
    if isinstance(steps_per_execution, str):
        if steps_per_execution != "auto":
            raise BuildError(
                f"Received steps_per_execution={steps_per_execution!r}; expected a positive int or 'auto'. "
                "Pass steps_per_execution='auto' to have tfstrategy pick it at the first fit."
            )
        compile_args = {**compile_args, "steps_per_execution": 1}
    with strategy.scope(), recording():
        built, restored = _make_model(model, compile_args)
        if compile_args:
            optimizer = compile_args.get("optimizer")
            if callable(optimizer) and not isinstance(optimizer, tf().keras.optimizers.Optimizer):
                # A factory: the optimizer is made here, inside the scope.
                compile_args = {**compile_args, "optimizer": optimizer()}
            _check_identifiers(compile_args)
            try:
                built.compile(**compile_args)
            except ValueError as error:
                if isinstance(compile_args.get("optimizer"), str) and "optimizer identifier" in str(error):
                    _refuse_identifier("optimizer", compile_args["optimizer"])
                raise
        # Audit before building the optimizer: an optimizer made outside the
        # scope would fail there with "Mixing different tf.distribute.Strategy
        # objects" instead of this error naming where it was made.
        require_scope(built, strategy, from_build_in_scope=True)
        _build_optimizer(built)
        if checkpoint is not None:
            if restored is not None:
                raise CheckpointError(
                    f"Received model={str(model)!r} and checkpoint={os.fspath(checkpoint)!r}; a .keras model "
                    "already carries its weights. Pass only one of them."
                )
            restored = restore_checkpoint(built, checkpoint)
    audit = require_scope(built, strategy, require_built_optimizer=True, from_build_in_scope=True)
    if guard:
        guard_model(built, strategy)
    if steps_per_execution == "auto":
        # Experimental: loaded only here, so a build without "auto" carries none of the tuner's machinery.
        from tfstrategy.training.steps_per_execution import tune_at_first_fit

        tune_at_first_fit(built)
    report = BuildReport(
        strategy=strategy_name(strategy),
        replicas=int(strategy.num_replicas_in_sync),
        audit=audit,
        restore=restored,
        steps_per_execution=steps_per_execution,
    )
    return built, report
