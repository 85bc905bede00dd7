"""A replaced ``__new__`` that a class inherited from ``object`` is put back so the class still makes instances."""

from __future__ import annotations

from types import ModuleType

from tfstrategy.state.replacement import Replacement


class Strategy:
    def __init__(self, devices: object = None) -> None:
        self.devices = devices


def test_a_class_whose_inherited_new_was_replaced_makes_instances_with_arguments_after_remove():
    module = ModuleType("fake_distribute")
    module.Strategy = Strategy

    class NewReplaced(Replacement):
        name = "new_replaced"

        def target_module(self):
            return module

        def chosen_targets(self, found):
            return ("Strategy.__new__",)

        def replacement(self, target, original):
            return staticmethod(lambda cls, *args, **kwargs: object.__new__(cls))

    replacement = NewReplaced()
    replacement.apply()
    assert Strategy(devices=["/cpu:0"]).devices == ["/cpu:0"]
    replacement.remove()
    # Without the mend, CPython raises "object.__new__() takes exactly one argument" here.
    assert Strategy(devices=["/cpu:1"]).devices == ["/cpu:1"] and Strategy().devices is None
