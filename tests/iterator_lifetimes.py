"""Each test's multi-device iterators are freed when it ends (a pytest plugin that ``conftest.py`` loads).

Why: tearing down a tf.data iterator whose autotuning thread is asleep can wait out that sleep, holding the
GIL (``docs/reference/upstream-bugs.md#iterator-teardown``): TensorFlow wakes the thread to cancel it before it
marks the iterator cancelled, so the thread, woken early, may see nothing and sleep again. The sleep doubles
with each tuning round, from 10 ms to 60 s, so what a missed wake-up costs grows with the iterator's age.

A distributed dataset's iterator (a ``MultiDeviceIterator``, what ``fit`` on 2+ replicas reads) sits in
reference cycles: the per-device generators' functions capture it. Only the collector frees it, and in a long
pytest worker with a large heap the full collections are minutes apart, so it was freed minutes old inside some
later test: a test that takes seconds was seen to take 96 to 208 s, its main thread in that teardown, 2 to 4
missed wake-ups of 60 s each. Collected when the test that made it ends (or, held by a module's fixture, when the
module ends), it is as old as that test (or module), and a missed wake-up costs no more than that, right after it.

The collection runs once pytest has dropped the test's fixture values, after its timed phases: no timeout could
stop a missed wake-up anyway (the main thread waits in TensorFlow's C++ holding the GIL, so no signal handler runs).
Only tests that made one pay for the collection (0.1 to 1.5 s, growing with the pytest worker's heap); the others
pay nothing. Nothing is frozen (``gc.freeze()`` would halve each collection): the suite's processes keep the
collector as a user's process has it, which ``tfstrategy check``'s own use of ``gc.freeze()`` is tested against.
"""

from __future__ import annotations

import gc
import sys

import pytest

_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"
#: Multi-device iterators made by the running test, and by its module's tests so far (a module fixture's go with it).
_made = {"test": 0, "module": 0}


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
        _made["test"] += 1
        _made["module"] += 1
        made(self, *args, **kwargs)

    counting_init.__counted__ = True  # type: ignore[attr-defined]
    owned.__init__ = counting_init


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Collect once the test is over: its fixtures torn down (its module's too, when it is the module's last) and
    dropped by pytest, which holds their values until the tear-down hooks have run."""
    _count_multi_device_iterators()
    _made["test"] = 0
    yield
    module_ends = nextitem is None or nextitem.path != item.path
    if _made["test"] or (module_ends and _made["module"]):
        gc.collect()
    if module_ends:
        _made["module"] = 0
