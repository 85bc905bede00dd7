"""The global random generators of Keras 3, TensorFlow and NumPy, found without creating any."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from tfstrategy._compat.registry import accessor


@accessor("keras.src.backend.common.global_state:get_global_attribute", "keras.src.random.seed_generator:SeedGenerator")
def keras_global_seed_generator() -> Any:
    """Keras 3's global ``SeedGenerator`` (unseeded ``keras.random`` calls draw from it), if one was made."""
    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
    except ImportError:  # tf_keras only, or a Keras that moved them
        return None
    # The attribute's name: a constant since Keras 3.11, the same string in 3.10.
    name = getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator")
    return global_state.get_global_attribute(name)


@accessor("tensorflow.python.ops.stateful_random_ops:global_generator")
def tf_global_generator() -> Any:
    """TensorFlow's global ``tf.random.Generator``, if one was made (never makes one)."""
    module = sys.modules.get("tensorflow.python.ops.stateful_random_ops")
    return getattr(module, "global_generator", None)


def numpy_if_imported() -> ModuleType | None:
    """NumPy, if something imported it (so saving its random state costs no import)."""
    return sys.modules.get("numpy")


@accessor("keras.src.random.seed_generator:SeedGenerator.state")
def model_seed_states(model: Any) -> list[Any]:
    """The state variables of the Keras 3 ``SeedGenerator`` objects of ``model``'s layers, in the model's order.

    Keras 3 lists them in ``model.variables`` but ``save_weights`` does not write them (a layer saves only its
    weights), so a model loaded from a backup draws its first random numbers again. They are found by the name
    ``SeedGenerator`` gives its state variable; tf_keras has none (its layers draw from stateful ops).
    """
    found = []
    for variable in getattr(model, "variables", None) or []:
        name = str(getattr(variable, "name", "")).split(":")[0].rsplit("/", 1)[-1]
        if name == "seed_generator_state":
            found.append(variable)
    return found
