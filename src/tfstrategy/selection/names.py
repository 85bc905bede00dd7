"""One name per strategy in everything tfstrategy tells a user (pure: no TensorFlow).

TensorFlow's classes do not always carry the names users write:
``tf.distribute.MultiWorkerMirroredStrategy()`` is an instance of
``CollectiveAllReduceStrategy``, ``tf.distribute.experimental.ParameterServerStrategy``
of ``ParameterServerStrategyV2``, and a model outside any scope has
``_DefaultDistributionStrategy``. A message naming the class would call one
strategy by two names (issue 35), so every user-facing message names a strategy
through :func:`strategy_name` (a test scans the sources for ``type(strategy).__name__``).
"""

from __future__ import annotations

__all__ = ["DEFAULT_STRATEGY", "strategy_name"]

#: How the strategy in effect outside any ``strategy.scope()`` is named.
DEFAULT_STRATEGY = "the default strategy"

#: TensorFlow's class names -> the public name users create the strategy by.
_PUBLIC_NAMES = {
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategyV1": "MultiWorkerMirroredStrategy",
    "_CollectiveAllReduceStrategyExperimental": "MultiWorkerMirroredStrategy",
    "MirroredStrategyV1": "MirroredStrategy",
    "OneDeviceStrategyV1": "OneDeviceStrategy",
    "CentralStorageStrategyV1": "CentralStorageStrategy",
    "ParameterServerStrategyV1": "ParameterServerStrategy",
    "ParameterServerStrategyV2": "ParameterServerStrategy",
    "TPUStrategyV1": "TPUStrategy",
    "TPUStrategyV2": "TPUStrategy",
    "_DefaultDistributionStrategy": DEFAULT_STRATEGY,
    "_DefaultDistributionStrategyV1": DEFAULT_STRATEGY,
}


def strategy_name(strategy_or_class: object) -> str:
    """The name a user knows ``strategy_or_class`` by (an instance or a class).

    Example:
        >>> strategy_name(tf.distribute.MultiWorkerMirroredStrategy())
        'MultiWorkerMirroredStrategy'
        >>> strategy_name(tf.distribute.get_strategy())
        'the default strategy'

    A class of the user's own (a subclass) keeps its name; ``None`` is the default strategy.
    """
    if strategy_or_class is None:
        return DEFAULT_STRATEGY
    klass = strategy_or_class if isinstance(strategy_or_class, type) else type(strategy_or_class)
    return _PUBLIC_NAMES.get(klass.__name__, klass.__name__)
