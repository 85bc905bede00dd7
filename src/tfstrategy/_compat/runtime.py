"""The eager runtime and tracing state: whether the runtime started, autograph, variable creators."""

from __future__ import annotations

import sys
from types import ModuleType

from tfstrategy._compat.registry import accessor
from tfstrategy._tf import tf


@accessor("tensorflow.python.util.tf_stack:_source_mapper_stacks", "tensorflow.python.util.tf_stack:_get_thread_key")
def autograph_source_map() -> dict[tuple[str, int], tuple[str, int, str]]:
    """Autograph's map from its generated code to the user's, for the function being converted now.

    ``{(generated_file, line): (user_file, line, function)}``; empty outside
    autograph. Autograph pushes one mapper per converted call on a per-thread
    stack in ``tf_stack`` (its tracebacks use it); the top one merges its parents.
    """
    try:
        from tensorflow.python.util import tf_stack

        stack = tf_stack._source_mapper_stacks.get(tf_stack._get_thread_key())
        return dict(stack[-1].get_effective_source_map()) if stack else {}
    except Exception:  # internals moved: report the generated file rather than fail a variable's creation
        return {}


@accessor("tensorflow.python.eager.context:Context._context_handle")
def runtime_started() -> bool:
    """Whether this process's TensorFlow runtime (eager context) has started; ``False`` if TF is not imported."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    # No public query exists; the eager context's handle is created exactly when
    # the runtime starts (the first op or device listing).
    return context.context()._context_handle is not None


@accessor("tensorflow.python.framework.ops:Graph._variable_creator_stack")
def variable_creator_scope_open() -> bool:
    """Whether some ``tf.variable_creator_scope`` is open in this thread."""
    graph = tf().compat.v1.get_default_graph()
    return bool(getattr(graph, "_variable_creator_stack", None))


@accessor("tensorflow.python.framework.ops:Graph._variable_creator_stack")
def install_variable_creator(creator: object) -> None:
    """Add ``creator`` to this thread's variable creator stack for the rest of the thread's life.

    What ``tf.variable_creator_scope`` does on entry, without a context to exit:
    a scope kept open for a thread's life is closed by the garbage collector when
    the thread ends (Ray Train's training thread), after TensorFlow's
    thread-local stack is gone, and its exit raises ``AttributeError: '_thread._local'
    object has no attribute '_variable_creator_stack'``. The stack TensorFlow builds
    inside the scope (entries of whatever shape this release uses) is copied and set
    again once the scope has closed; a new list, so a scope opened later still finds
    its own on exit.
    """
    graph = tf().compat.v1.get_default_graph()
    with tf().variable_creator_scope(creator):
        stack = list(graph._variable_creator_stack)
    graph._variable_creator_stack = stack


@accessor("tensorflow.python.eager.context:Context")
def eager_context_module() -> ModuleType:
    """TensorFlow's eager context module (``Context`` and its collective configuration)."""
    from tensorflow.python.eager import context

    module: ModuleType = context
    return module
