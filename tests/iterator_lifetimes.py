"""Each test's multi-device iterators are freed when it ends (a pytest plugin that ``conftest.py`` loads).

Why: tearing down a tf.data iterator whose autotuning thread is asleep can wait out that sleep, holding the
GIL (``docs/reference/upstream-bugs.md#iterator-teardown``): TensorFlow wakes the thread to cancel it before it
marks the iterator cancelled, so the thread, woken early, may see nothing and sleep again. The sleep doubles
with each tuning round, from 10 ms to 60 s, so what a missed wake-up costs grows with the iterator's age.

A distributed dataset's iterator (a ``MultiDeviceIterator``, what ``fit`` on 2+ replicas reads) sits in
reference cycles: the per-device generators' functions capture it. Only the collector frees it, and in a long
pytest worker with a large heap the full collections are minutes apart, so it was freed minutes old inside some
later test: a test that takes seconds was seen to take 96 to 208 s, its main thread in that teardown, 2 to 4
missed wake-ups of 60 s each. Collected when the test that made it ends, it is as old as that test, and a missed
wake-up costs no more than that, within the test that made it.

Only tests that made one pay for the collection (0.1 to 1.5 s, growing with the pytest worker's heap); the others
pay nothing. Nothing is frozen (``gc.freeze()`` would halve each collection): the suite's processes keep the
collector as a user's process has it, which ``tfstrategy check``'s own use of ``gc.freeze()`` is tested against.
"""

from __future__ import annotations

import gc
import sys

import pytest

_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"
_made = [0]


def _count_multi_device_iterators() -> None:
    """Count each ``OwnedMultiDeviceIterator`` made from now on in ``_made`` (once per process)."""
    module = sys.modules.get(_MODULE)
    if module is None:
        return
    owned = module.OwnedMultiDeviceIterator
    if getattr(owned.__init__, "__counted__", False):
        return
    made = owned.__init__

    def counting_init(self, *args, **kwargs):
        _made[0] += 1
        made(self, *args, **kwargs)

    counting_init.__counted__ = True  # type: ignore[attr-defined]
    owned.__init__ = counting_init


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _count_multi_device_iterators()
    _made[0] = 0


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    if _made[0]:
        _made[0] = 0
        gc.collect()
