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


@accessor("keras.src.trainers.data_adapters.generator_data_adapter:GeneratorDataAdapter")
def generator_first_batch(epoch_iterator: object) -> Any:
    """The first batch Keras 3 already took from a Python generator to make ``epoch_iterator``, or ``None``.

    ``GeneratorDataAdapter`` draws the generator's first batches to learn their spec and replays them at the
    start of every pass; any other data (arrays, a ``tf.data.Dataset``, a ``PyDataset``) gives ``None``.
    """
    try:
        from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter
    except ImportError:
        return None
    adapter = getattr(epoch_iterator, "data_adapter", None)
    batches = getattr(adapter, "_first_batches", None) if isinstance(adapter, GeneratorDataAdapter) else None
    return batches[0] if batches else None


@accessor("keras.src.backend.tensorflow.trainer:TFEpochIterator")
def tf_epoch_iterator(strategy: object, x: object, steps_per_epoch: int) -> Any:
    """The epoch iterator Keras 3's ``fit`` makes for ``x`` on ``strategy`` (one execution a step)."""
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    return TFEpochIterator(distribute_strategy=strategy, x=x, steps_per_epoch=steps_per_epoch)


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build",
          "keras.src.models.model:Model")
def trainer_build_peek(model: object, iterator: object = None, data_batch: object = None) -> object:
    """Run ``TensorFlowTrainer._maybe_symbolic_build`` as installed now (a patch may wrap it), whatever ``Model``
    itself defines: the method a patch on ``Model._maybe_symbolic_build`` extends."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer._maybe_symbolic_build(model, iterator=iterator, data_batch=data_batch)


@accessor("keras.src.trainers.epoch_iterator:EpochIterator.reset")
def epoch_iterator_reader(epoch_iterator: object) -> object:
    """The iterator over the data that ``epoch_iterator``'s current pass made (``None`` before a pass, or after
    ``reset``; Keras 3 keeps it between passes when ``steps_per_epoch`` is given)."""
    return getattr(epoch_iterator, "_current_iterator", None)
