"""Two replacements of one function stack, and either comes off first without taking the other with it.

Found by CI (2026-12-07): ``keras_uneven_batches`` and ``keras_cross_replica_loss`` both replace Keras'
``scale_loss_for_distribution``; a test that removed the lower one put Keras' own function back over the
upper one, which still said it was installed, and the next module's loss came out halved.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tfstrategy.state.registry import RUNTIME
from tfstrategy.state.replacement import Replacement


def _module() -> ModuleType:
    module = ModuleType("fake_losses")
    module.scale = lambda value: value / 2  # type: ignore[attr-defined]
    module.Losses = type("Losses", (), {"scale": lambda self, value: value / 2})  # type: ignore[attr-defined]
    return module


def _layer(module: ModuleType, name: str, change) -> Replacement:
    class Layer(Replacement):
        targets = ("scale", "Losses.scale")

        def target_module(self):
            return module

        def replacement(self, target, original):
            def replaced(*args):
                return change(original(*args))
            return replaced

    Layer.name = name
    return Layer()


def _values(module: ModuleType) -> tuple[float, float]:
    return module.scale(8.0), module.Losses().scale(8.0)


@pytest.mark.parametrize("first_off", ["lower", "upper"])
def test_either_of_two_stacked_replacements_comes_off_first_and_leaves_the_other(first_off):
    module = _module()
    lower, upper = _layer(module, "lower", lambda v: v + 1), _layer(module, "upper", lambda v: v * 10)
    lower.apply()
    upper.apply()
    assert _values(module) == (50.0, 50.0)  # (8 / 2 + 1) * 10
    gone, kept = (lower, upper) if first_off == "lower" else (upper, lower)
    gone.remove()
    assert _values(module) == ((40.0, 40.0) if kept is upper else (5.0, 5.0))
    assert kept.status().installed == ("scale", "Losses.scale") and gone.status().installed == ()
    gone.apply()  # back on top
    kept.remove()
    assert _values(module) == ((5.0, 5.0) if gone is lower else (40.0, 40.0))
    gone.remove()
    assert _values(module) == (4.0, 4.0)
    assert "scale" not in vars(module.Losses) or vars(module.Losses)["scale"](None, 8.0) == 4.0
    assert all(item not in RUNTIME.replacements() for item in (lower, upper))


def test_the_middle_of_three_comes_off_and_the_two_left_still_wrap_in_their_order():
    module = _module()
    layers = [_layer(module, name, change) for name, change in
              (("plus_one", lambda v: v + 1), ("times_ten", lambda v: v * 10), ("minus_three", lambda v: v - 3))]
    for layer in layers:
        layer.apply()
    assert _values(module) == (47.0, 47.0)  # (4 + 1) * 10 - 3
    layers[1].remove()
    assert _values(module) == (2.0, 2.0)  # 4 + 1 - 3
    layers[0].remove()
    assert _values(module) == (1.0, 1.0)
    layers[2].remove()
    assert _values(module) == (4.0, 4.0)


def test_an_inherited_method_replaced_twice_is_inherited_again_once_both_are_off():
    module = _module()
    base = module.Losses
    module.Losses = type("Child", (base,), {})  # type: ignore[attr-defined]
    lower, upper = _layer(module, "lower", lambda v: v + 1), _layer(module, "upper", lambda v: v * 10)
    lower.apply()
    upper.apply()
    lower.remove()  # from under the upper one: the upper one now replaces what the lower one had (inherited)
    assert module.Losses().scale(8.0) == 40.0
    upper.remove()
    assert "scale" not in vars(module.Losses) and module.Losses().scale(8.0) == 4.0
