"""The suite frees each test's multi-device iterators when it ends (tests/iterator_lifetimes.py).

A multi-device iterator left in a reference cycle lives until a full collection, minutes later in a long pytest
worker; its teardown then can wait up to 60 s for TensorFlow's tf.data autotuning thread, inside another test
(docs/reference/upstream-bugs.md#iterator-teardown). Run in this process: its CPU is split into replicas already.
"""

from __future__ import annotations

import gc

import pytest

from helpers import mirrored

TWO_TESTS = """
    import gc, weakref
    import tensorflow as tf
    from tensorflow.python.data.ops.multi_device_iterator_ops import OwnedMultiDeviceIterator
    from helpers import mirrored

    MADE = []

    def test_makes_a_multi_device_iterator_in_a_cycle():
        gc.disable()  # only the plugin's collection may free it
        before = {id(o) for o in gc.get_objects() if isinstance(o, OwnedMultiDeviceIterator)}
        dataset = mirrored(2).experimental_distribute_dataset(tf.data.Dataset.range(16).batch(4))
        iterator = iter(dataset)
        next(iterator)
        cycle = [iterator]
        cycle.append(cycle)
        MADE.extend(weakref.ref(o) for o in gc.get_objects()
                    if isinstance(o, OwnedMultiDeviceIterator) and id(o) not in before)
        assert MADE

    def test_the_next_test_starts(tmp_path_factory):
        alive = sum(ref() is not None for ref in MADE)  # before gc.enable(): a young cycle goes at the next allocation
        gc.enable()
        (tmp_path_factory.getbasetemp().parent / "alive").write_text(f"{alive} of {len(MADE)}")
"""


@pytest.mark.parametrize(("plugin", "freed"), [("iterator_lifetimes", True), ("no:iterator_lifetimes", False)])
def test_a_tests_multi_device_iterators_are_freed_when_it_ends(pytester, plugin, freed):
    """Without the plugin (the control), the iterator in a cycle outlives its test."""
    mirrored(2)  # the strategy the inner tests use, made here so that it is not their garbage
    pytester.makepyfile(test_two=TWO_TESTS)
    try:
        result = pytester.runpytest_inprocess("-p", plugin, "-p", "no:cacheprovider", f"--basetemp={pytester.path / 't'}")
    finally:
        gc.enable()
    result.assert_outcomes(passed=2)
    alive, _, made = (pytester.path / "alive").read_text().partition(" of ")
    assert int(made) > 0 and int(alive) == (0 if freed else int(made)), f"{alive} of {made} alive"
