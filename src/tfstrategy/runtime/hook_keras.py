"""The hook's Keras steps of its own: Keras 2's ``reset_states`` alias, the scope audit, the performance report.

Each installs :class:`~tfstrategy.runtime.rewrites.Rewrite` objects on every
Keras the script uses (tf.keras's, and Keras 3's beside tf_keras).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy.errors import ScopeError
from tfstrategy.state.registry import RUNTIME

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

__all__ = ["audit", "keras2_aliases", "performance_report"]


def keras2_aliases() -> str | None:
    from tfstrategy import _compat
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    keras = _compat.keras_for()
    metric = keras.metrics.Metric
    if hasattr(metric, "reset_states") or not hasattr(metric, "reset_state"):
        return None

    def alias(original: object) -> Callable[..., object]:
        def reset_states(self: Any) -> None:
            """Keras 2's name of :meth:`reset_state` (added back by tfstrategy's start-up hook)."""
            RUNTIME.hook.changed("keras2_aliases", "Metric.reset_states() (Keras 2) ran as reset_state()")
            self.reset_state()

        return reset_states

    install_rewrite(Rewrite("keras2_aliases", lambda: keras, {"metrics.Metric.reset_states": alias}))
    return "Metric.reset_states() calls reset_state() (Keras 2 name, used by TensorFlow's tutorials)"


def audit(mode: str) -> str | None:
    """``Model.fit`` and ``evaluate`` audit the model's scope first (``warn`` or ``stop``)."""
    if mode == "off":
        return None
    from tfstrategy.runtime.hook_strategies import keras_flavours
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    for keras in keras_flavours():
        factories = {f"Model.{method}": functools.partial(_audited, method=method, mode=mode)
                     for method in ("fit", "evaluate")}
        install_rewrite(Rewrite(f"audit:{keras.__name__}", lambda k=keras: k, factories))
    return f"Model.fit and Model.evaluate audit the scope first ({mode})"


def _audited(original: Callable[..., object], method: str, mode: str) -> Callable[..., object]:
    @functools.wraps(original)
    def wrapper(model: Model, *args: object, **kwargs: object) -> object:
        if method == "fit":
            from tfstrategy.training.datasets import refuse_endless_fit
            from tfstrategy.training.sentinel import add_sentinel, resolve_sentinel

            refuse_endless_fit(args, kwargs)
            add_sentinel(model, kwargs, resolve_sentinel())  # TFSTRATEGY_SENTINEL (launch: epoch)
        _audit_model(model, method, mode)
        return original(model, *args, **kwargs)

    return wrapper


def _audit_model(model: Model, method: str, mode: str) -> None:
    import tensorflow as tf

    from tfstrategy import _compat
    from tfstrategy.scope.audit import audit_scope

    if id(model) in RUNTIME.audited:
        return
    RUNTIME.audited.add(id(model))
    strategy = _compat.model_strategy(model) or tf.distribute.get_strategy()
    report = audit_scope(model, strategy)
    for advice in report.advice:
        print(f"tfstrategy: {advice}", file=sys.stderr, flush=True)
    RUNTIME.hook.audited += 1
    if report.passed:
        return
    message = report.message()
    RUNTIME.hook.findings.append(message)
    if mode == "stop":
        raise ScopeError(f"tfstrategy stopped {method}() before its first step (--audit stop):\n{message}")
    print(f"tfstrategy: scope audit before {method}() (--audit warn, training goes on):\n{message}",
          file=sys.stderr, flush=True)


def performance_report() -> str | None:
    from tfstrategy.performance.report import tracker_from_environment
    from tfstrategy.runtime.hook_strategies import keras_flavours
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    settings = tracker_from_environment()
    if settings is None:
        return None
    for keras in keras_flavours():
        factories = {"Model.fit": functools.partial(_reported, settings=settings)}
        install_rewrite(Rewrite(f"performance_report:{keras.__name__}", lambda k=keras: k, factories))
    return f"Model.fit reports where each step's time goes, into {settings['directory']}"


def _reported(original: Callable[..., object], settings: dict[str, object]) -> Callable[..., object]:
    @functools.wraps(original)
    def wrapper(model: Model, *args: object, **kwargs: object) -> object:
        from tfstrategy.performance.report import add_report

        if len(args) > 5:  # callbacks passed positionally: fit(x, y, batch_size, epochs, verbose, callbacks, ...)
            given = {"callbacks": args[5]}
            add_report(model, args, given, settings)
            args = (*args[:5], given["callbacks"], *args[6:])
        else:
            add_report(model, args, kwargs, settings)
        RUNTIME.hook.changed("performance_report", f"fit's performance report written into {settings['directory']}")
        return original(model, *args, **kwargs)

    return wrapper
