"""The suite frees each test's multi-device iterators when it ends (tests/iterator_lifetimes.py).

A multi-device iterator left in a reference cycle lives until a full collection, minutes later in a long pytest
worker; its teardown then can wait up to 60 s for TensorFlow's tf.data autotuning thread, inside another test
(docs/reference/upstream-bugs.md#iterator-teardown). Run in this process: its CPU is split into replicas already.
"""

from __future__ import annotations

import gc

import pytest

from helpers import mirrored

MAKES = """
    import gc, weakref
    import pytest
    import tensorflow as tf
    from tensorflow.python.data.ops.multi_device_iterator_ops import OwnedMultiDeviceIterator
    from helpers import mirrored
    import shared_refs

    def make():
        gc.disable()  # only the plugin's collection may free it; test_b_counts turns the collector back on
        before = {{id(o) for o in gc.get_objects() if isinstance(o, OwnedMultiDeviceIterator)}}
        iterator = iter(mirrored(2).experimental_distribute_dataset(tf.data.Dataset.range(16).batch(4)))
        next(iterator)
        cycle = [iterator]
        cycle.append(cycle)
        shared_refs.MADE.extend(weakref.ref(o) for o in gc.get_objects()
                                if isinstance(o, OwnedMultiDeviceIterator) and id(o) not in before)
        assert shared_refs.MADE
        return cycle

    @pytest.fixture(scope="module")
    def held():
        yield make() if {where!r} == "module-fixture" else None

    def test_makes(held):
        if {where!r} == "test":
            make()

    def test_another_of_the_module(held):
        pass
"""

COUNTS = """
    import gc
    import shared_refs

    def test_counts(tmp_path_factory):
        alive = sum(ref() is not None for ref in shared_refs.MADE)  # before gc.enable(): a young cycle goes at once
        gc.enable()
        (tmp_path_factory.getbasetemp().parent / "alive").write_text(f"{{alive}} of {{len(shared_refs.MADE)}}")
"""


@pytest.mark.parametrize("where", ["test", "module-fixture"])
@pytest.mark.parametrize(("plugin", "freed"), [("iterator_lifetimes", True), ("no:iterator_lifetimes", False)])
def test_the_multi_device_iterators_of_a_test_or_a_module_fixture_are_freed_when_it_ends(pytester, where, plugin,
                                                                                        freed):
    """Without the plugin (the control), the iterator in a cycle outlives the test or module that made it."""
    mirrored(2)  # the strategy the inner tests use, made here so that it is not their garbage
    pytester.syspathinsert()
    pytester.makepyfile(shared_refs="MADE = []", test_a_makes=MAKES.format(where=where),
                        test_b_counts=COUNTS.format())
    try:
        result = pytester.runpytest_inprocess("-p", plugin, "-p", "no:cacheprovider", f"--basetemp={pytester.path / 't'}")
    finally:
        gc.enable()
    result.assert_outcomes(passed=3)
    alive, _, made = (pytester.path / "alive").read_text().partition(" of ")
    assert int(made) > 0 and int(alive) == (0 if freed else int(made)), f"{alive} of {made} alive"
