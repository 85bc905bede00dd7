"""Restore a checkpoint into a built model and optimizer, all or nothing.

Three formats: a ``tf.train.Checkpoint`` directory or prefix, a Keras
``.weights.h5`` file and a ``.keras`` archive. Each is checked against the
model and optimizer before and after loading; on any failure every variable
is put back to its value before the restore and :class:`CheckpointError` names
the file and what did not match, so nothing is ever half-restored silently.
Call these inside the strategy's scope with the optimizer built
(:func:`tfstrategy.build_in_scope` does both).
"""

from __future__ import annotations

import io
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import CheckpointError

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Optimizer

__all__ = ["RestoreReport", "restore_checkpoint", "load_keras_model"]

TF_CHECKPOINT, WEIGHTS_H5, KERAS = "tf.train.Checkpoint", "weights.h5", "keras"
EXPECTED = (
    "Expected a tf.train.Checkpoint directory or prefix (e.g. ckpts/ or ckpts/ckpt-3, written with "
    "tf.train.Checkpoint(model=model, optimizer=model.optimizer)), a .weights.h5 or a .keras file"
)
#: Keras warnings that mean part of a file was not loaded.
_SKIPPED = re.compile(r"^Skipping ")
_OPTIMIZER_SKIPPED = re.compile(r"^Skipping variable loading for optimizer")


@dataclass(frozen=True)
class RestoreReport:
    """What a restore put into the model and optimizer."""

    source: str
    format: str
    weights: int
    optimizer_state: bool
    step: int

    def lines(self) -> list[str]:
        return [
            f"restored {self.source} ({self.format})",
            f"restored_weights {self.weights}",
            f"restored_optimizer_state {self.optimizer_state}",
            f"restored_step {self.step}",
        ]


_SHAPES = re.compile(r"variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))")
_PATH = re.compile(r"Target variable: <Variable path=([^,]+),")


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    shapes, path = _SHAPES.search(text), _PATH.search(text)
    if shapes:
        # Keras appends the whole variable value; keep the part that says what did not match.
        where = f"variable {path.group(1)}" if path else "a variable"
        return f"{where} has shape {shapes.group(1)} in this model but {shapes.group(2)} in the file"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:400]


@contextmanager
def _all_or_nothing(model: Model, source: str, what: str) -> Iterator[None]:
    """Put every model and optimizer variable back if the block fails."""
    variables = list(model.weights) + list(model.optimizer.variables if model.optimizer else [])
    # A host copy of every value; the price of never leaving a half-restored model.
    saved = [variable.numpy() for variable in variables]
    try:
        yield
    except BaseException as error:
        for variable, value in zip(variables, saved):
            variable.assign(value)
        if isinstance(error, CheckpointError) or not isinstance(error, Exception):
            raise
        raise CheckpointError(
            f"Could not restore {what} {source!r}: {_first_line(error)}. The model and optimizer were left as "
            "they were before the restore. Check that the file is complete and was written by the same model "
            "and optimizer."
        ) from error


def _optimizer_slot_free_count(optimizer: Optimizer) -> int:
    """Variables an unbuilt optimizer has (iterations, learning rate), i.e. state without slots."""
    return sum(1 for v in optimizer.variables if v is optimizer.iterations or v.path.endswith("/learning_rate"))


def _open_weights_h5(path: str, inside_zip: bool) -> Any:
    import h5py

    try:
        if inside_zip:
            with zipfile.ZipFile(path) as archive:
                return h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        return h5py.File(path, "r")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        kind = ".keras archive" if inside_zip else ".weights.h5 file"
        raise CheckpointError(
            f"Could not read {path!r} as a {kind} ({_first_line(error)}); it is truncated or not written by Keras. "
            f"Write it again (model.save / model.save_weights) or pass another file. {EXPECTED}."
        ) from error


def _saved_optimizer_count(path: str, inside_zip: bool) -> int:
    with _open_weights_h5(path, inside_zip) as weights:
        group = weights.get("optimizer/vars")
        return 0 if group is None else len(group.keys())


def _load_with_keras(load: Callable[[], Any], optimizer_of: Callable[[], Any], source: str, saved: int) -> bool:
    """Run a Keras load; return whether the optimizer state was loaded. Raise on any skipped part."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load()
    optimizer_loaded = True
    for warning in caught:
        text = str(warning.message)
        if _OPTIMIZER_SKIPPED.match(text):
            model_optimizer = optimizer_of()
            ours = len(model_optimizer.variables) if model_optimizer is not None else 0
            if model_optimizer is None or saved <= _optimizer_slot_free_count(model_optimizer):
                optimizer_loaded = False  # saved before its optimizer was built: weights only
                continue
            raise CheckpointError(
                f"Optimizer state in {source!r} does not match: the file has {saved} optimizer variables, this "
                f"optimizer has {ours} ({type(model_optimizer).__name__} over the model's trainable variables). "
                "Compile with the optimizer the checkpoint was written with, or restore a matching file."
            )
        if _SKIPPED.match(text):
            raise CheckpointError(f"Part of {source!r} does not match the model: {text.strip()}")
    return optimizer_loaded and saved > 0


def _require_file(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise CheckpointError(
            f"Received checkpoint={path!r}, a directory; expected a {what} file. Pass the file itself, or for a "
            f"tf.train.Checkpoint directory a name without the {what} ending. {EXPECTED}."
        )
    if not os.path.isfile(path):
        raise CheckpointError(f"Received checkpoint={path!r}; no such {what} file. {EXPECTED}.")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"Received checkpoint={path!r}; this process may not read it (permission denied). "
                              "Fix its permissions or run as its owner.")


def _restore_keras_weights(model: Model, path: str, inside_zip: bool) -> RestoreReport:
    _require_file(path, ".keras" if inside_zip else ".weights.h5")
    saved = _saved_optimizer_count(path, inside_zip)
    with _all_or_nothing(model, path, "the weights in"):
        loaded = _load_with_keras(lambda: model.load_weights(path), lambda: model.optimizer, path, saved)
    return RestoreReport(
        source=path,
        format=KERAS if inside_zip else WEIGHTS_H5,
        weights=len(model.weights),
        optimizer_state=loaded,
        step=int(model.optimizer.iterations.numpy()) if loaded else 0,
    )


def _checkpoint_prefix(path: str) -> str:
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise CheckpointError(
                f"Received checkpoint={path!r}, a directory this process may not read (permission denied), so its "
                "checkpoints cannot be listed. Fix its permissions (chmod u+rx) or run as its owner."
            )
        state = os.path.join(path, "checkpoint")
        if os.path.exists(state) and not os.access(state, os.R_OK):
            raise CheckpointError(
                f"Received checkpoint={path!r}, whose {state!r} file (naming the latest checkpoint) this process may "
                "not read (permission denied). Fix its permissions or run as its owner."
            )
        prefix = tf().train.latest_checkpoint(path)
        if prefix is None:
            raise CheckpointError(
                f"Received checkpoint={path!r}, a directory with no tf.train.Checkpoint in it (no 'checkpoint' "
                f"file naming a prefix with its .index). {EXPECTED}."
            )
        return str(prefix)
    path = re.sub(r"\.(index|data-\d+-of-\d+)$", "", path)  # accept a file of the checkpoint too
    if not os.path.isfile(path + ".index"):
        raise CheckpointError(
            f"Received checkpoint={path!r}; no such file or directory ({path}.index is missing). {EXPECTED}."
        )
    return path


def _checkpoint_contents(prefix: str) -> tuple[set[str], dict[str, list[int]]]:
    """Top-level object names and variable shapes of a checkpoint, read without restoring."""
    try:
        reader = tf().train.load_checkpoint(prefix)
        graph = _compat.checkpoint_object_graph(reader)
    except Exception as error:  # DataLossError, NotFoundError, DecodeError, ...
        raise CheckpointError(
            f"Could not read the checkpoint {prefix!r} ({_first_line(error)}); its .index or .data files are "
            f"truncated or missing. Restore another checkpoint or write it again. {EXPECTED}."
        ) from error
    roots = {child.local_name for child in graph.nodes[0].children}
    shapes = {key: shape for key, shape in reader.get_variable_to_shape_map().items() if key != _compat.checkpoint_object_graph_key()}
    return roots, shapes


def _tracked_variable_count(root: object) -> int:
    # Keras 3 variables wrap a tf.Variable; tf_keras' are tf.Variables.
    variable_types = (tf().Variable, *_compat.keras_variable_types())
    return sum(1 for obj in tf().train.TrackableView(root).descendants() if isinstance(obj, variable_types))


def _restore_tf_checkpoint(model: Model, path: str) -> RestoreReport:
    prefix = _checkpoint_prefix(path)
    roots, shapes = _checkpoint_contents(prefix)
    if "model" not in roots:
        raise CheckpointError(
            f"The checkpoint {prefix!r} holds {sorted(roots)} at its top level; expected 'model' (and 'optimizer'), "
            "as written by tf.train.Checkpoint(model=model, optimizer=model.optimizer)."
        )
    has_optimizer = "optimizer" in roots
    objects = {"model": model, **({"optimizer": model.optimizer} if has_optimizer else {})}
    root = tf().train.Checkpoint(**objects)
    ours = [key for key in shapes if key.split("/", 1)[0] in objects]
    expected = _tracked_variable_count(root)
    if len(ours) != expected:
        raise CheckpointError(
            f"The checkpoint {prefix!r} holds {len(ours)} model/optimizer variables; this model"
            f"{' and optimizer' if has_optimizer else ''} have {expected}. It was written by a different model or "
            "optimizer: rebuild the model it was written with, or restore a matching checkpoint."
        )
    with _all_or_nothing(model, prefix, "the checkpoint"):
        status = root.read(prefix)  # read(), not restore(): no save_counter to match, so write() checkpoints restore too
        try:
            status.assert_existing_objects_matched()
        except AssertionError as error:
            raise CheckpointError(
                f"The checkpoint {prefix!r} does not match the model: {_first_line(error)}. The model and optimizer "
                "were left as they were before the restore."
            ) from error
        status.expect_partial()  # save_counter and other extra roots are not ours to restore
    return RestoreReport(
        source=prefix,
        format=TF_CHECKPOINT,
        weights=len(model.weights),
        optimizer_state=has_optimizer,
        step=int(model.optimizer.iterations.numpy()) if has_optimizer else 0,
    )


def restore_checkpoint(model: Model, checkpoint: str | os.PathLike[str]) -> RestoreReport:
    """Restore ``checkpoint`` into a compiled model with a built optimizer, all or nothing.

    Raises:
        CheckpointError: missing, unreadable or mismatched; nothing is changed.
    """
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise CheckpointError(f"Received checkpoint={checkpoint!r} ({type(checkpoint).__name__}); expected a path. {EXPECTED}.")
    path = os.fspath(checkpoint)
    if path.endswith(".weights.h5"):
        return _restore_keras_weights(model, path, inside_zip=False)
    if path.endswith(".keras"):
        return _restore_keras_weights(model, path, inside_zip=True)
    if path.endswith(".h5"):
        raise CheckpointError(
            f"Received checkpoint={path!r}, a legacy .h5 file, which Keras 3 does not restore optimizer state from. "
            f"{EXPECTED}."
        )
    return _restore_tf_checkpoint(model, path)


def load_keras_model(path: str, *, compile: bool) -> tuple[Model, RestoreReport]:
    """``keras.models.load_model`` in the current scope, with clear errors and a report."""
    _require_file(path, ".keras")
    saved = _saved_optimizer_count(path, inside_zip=True)
    holder: dict[str, Any] = {}

    def load() -> None:
        holder["model"] = tf().keras.models.load_model(path, compile=compile)

    try:
        # The model does not exist yet, so there is nothing to roll back.
        loaded = _load_with_keras(load, lambda: getattr(holder.get("model"), "optimizer", None), path, saved)
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"Could not load the .keras model {path!r}: {_first_line(error)}. Check that the file is complete "
            "and that custom layers are registered (keras.saving.register_keras_serializable)."
        ) from error
    model = holder["model"]
    optimizer_state = bool(loaded) and model.optimizer is not None and _compat.optimizer_built(model.optimizer)
    return model, RestoreReport(
        source=path,
        format=KERAS,
        weights=len(model.weights),
        optimizer_state=optimizer_state,
        step=int(model.optimizer.iterations.numpy()) if optimizer_state else 0,
    )
