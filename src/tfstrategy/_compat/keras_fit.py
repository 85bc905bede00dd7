"""What a running ``fit`` reads: steps per execution, the initial epoch, the epoch iterator's dataset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfstrategy._compat.keras_flavour import is_tf_keras_object
from tfstrategy._compat.registry import accessor
from tfstrategy._tf import tf

if TYPE_CHECKING:
    from tfstrategy._protocols import Model


@accessor("keras.src.trainers.trainer:Trainer.steps_per_execution | tf_keras.src.engine.training:Model._steps_per_execution")
def steps_per_execution(model: Model) -> int:
    """A compiled model's K (Keras 3: an attribute; tf_keras: a variable)."""
    value: Any = getattr(model, "_steps_per_execution", None) if is_tf_keras_object(model) else None
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    value = value.numpy() if hasattr(value, "numpy") else value
    return int(value or 1)


@accessor("keras.src.trainers.trainer:Trainer.steps_per_execution | tf_keras.src.engine.training:Model._configure_steps_per_execution")
def set_steps_per_execution(model: Model, steps: int) -> None:
    """Set K on a compiled model (Keras 3: a plain attribute; tf_keras: a variable behind a private setter)."""
    configure = getattr(model, "_configure_steps_per_execution", None)
    if configure is not None and is_tf_keras_object(model):
        configure(steps)
    else:
        model.steps_per_execution = steps
    model.train_function = None  # rebuilt with the new K by the next make_train_function


@accessor("keras.src.backend.tensorflow.trainer:TFEpochIterator._distributed_dataset", "tensorflow.python.distribute.input_lib:DistributedDataset._original_dataset")
def epoch_iterator_source(epoch_iterator: object) -> Any:
    """The ``tf.data.Dataset`` a Keras 3 ``TFEpochIterator`` distributes, or ``None`` (data from a function,
    or another iterator)."""
    distributed = getattr(epoch_iterator, "_distributed_dataset", None)
    source = getattr(distributed, "_original_dataset", None)
    return source if isinstance(source, tf().data.Dataset) else None


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._initial_epoch | tf_keras.src.engine.training:Model._training_state")
def set_initial_epoch(model: Any, epoch: int, batch: int = 0) -> None:
    """Make the running ``fit`` start at ``epoch``, skipping its first ``batch`` steps.

    Keras 3 reads ``model._initial_epoch`` after ``on_train_begin`` (as its
    BackupAndRestore sets it). tf_keras asks ``model._training_state`` for the
    initial epoch and step after ``on_train_begin`` and skips the steps itself.
    """
    if is_tf_keras_object(model):
        class _State:
            def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: object, initial_epoch: int,
                                                      mode: object = None) -> tuple[int, int]:
                return epoch, batch

        model._training_state = _State()
        return
    model._initial_epoch = epoch


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._initial_epoch | tf_keras.src.engine.training:Model._training_state")
def clear_initial_epoch(model: Any) -> None:
    """Undo :func:`set_initial_epoch` once ``fit`` ends, so a later ``fit`` starts where it is asked to."""
    if is_tf_keras_object(model):
        if getattr(model, "_training_state", None) is not None:
            model._training_state = None
        return
    model._initial_epoch = None


def skip_keras3_steps(model: Model, batches: int) -> None:
    """Make Keras 3's ``fit`` consume the first ``batches`` batches of its epoch without training on them.

    Keras 3 resumes at epoch boundaries only: its ``fit`` calls ``model.train_function(iterator)``
    once per ``steps_per_execution`` batches, after ``on_train_begin``. The wrapper draws those
    batches from the iterator (the data order stays that of an uninterrupted run) and puts the
    real function back once they are consumed. tf_keras skips them itself
    (:func:`set_initial_epoch`).
    """
    if batches <= 0 or is_tf_keras_object(model):
        return
    original = model.train_function
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    left = [batches]

    def skipping(iterator: Any) -> object:
        if left[0] <= 0:
            return original(iterator)
        for _ in range(min(per_call, left[0])):
            next(iterator)
        left[0] -= per_call
        if left[0] <= 0:
            model.train_function = original
        return {}

    model.train_function = skipping


_BUILD_PEEK = "_maybe_symbolic_build"


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build")
def has_class_build_peek(model: Model) -> bool:
    """Whether a model runs its class's ``Trainer._maybe_symbolic_build`` (Keras 3's peek at one batch at the
    start of ``fit``): the class has one and the model does not override it."""
    return hasattr(type(model), _BUILD_PEEK) and _BUILD_PEEK not in vars(model)


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build")
def class_build_peek(model: Model, iterator: object = None, data_batch: object = None) -> object:
    """Run the model's class's ``_maybe_symbolic_build`` (looked up at each call: a patch may wrap it later)."""
    return getattr(type(model), _BUILD_PEEK)(model, iterator=iterator, data_batch=data_batch)


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build")
def build_peek_attribute() -> str:
    """The name of the trainer method that peeks at one batch to build the model (a model may shadow it)."""
    return _BUILD_PEEK
