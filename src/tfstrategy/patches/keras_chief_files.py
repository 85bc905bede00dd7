"""Keras 3 writes every file on every worker of a multi-worker job; only the chief should.

Root cause: tf_keras routed its file writers through
``distribute/distributed_file_utils.py`` (a worker that is not the chief wrote
to a temporary directory that was then removed; ``BackupAndRestore`` kept the
state of such workers in temporary copies and restored the chief's on every
worker). Keras 3 dropped that module and never replaced it: under
MultiWorkerMirroredStrategy every worker writes the path the script named. On
one machine, and on a cluster whose workers share a filesystem (a home
directory, NFS: most Slurm clusters), they write *one* file, so a run fails at
random with ``zipfile.BadZipFile: Bad CRC-32`` (a worker reads a checkpoint
another one rewrites), ``BlockingIOError: ... unable to lock file`` (h5py), or
``FileExistsError`` (``keras.src.utils.file_utils.makedirs`` is ``os.makedirs``
without ``exist_ok``, after an ``exists`` test that another worker races), and
``BackupAndRestore(backup_dir=D)`` with one ``D`` for every worker (as
TensorFlow's multi-worker tutorial writes it) fails at the end of epoch 1.

Fix: each writer goes through :func:`tfstrategy.multiworker.chief_files.chief_write`
(the chief writes the path; other workers write a private copy that is removed,
and return once the chief's file is complete):

- ``saving_lib.save_model`` (``Model.save``, ``keras.saving.save_model``,
  ``ModelCheckpoint``), ``saving_lib.save_weights_only`` (``save_weights``, weights-only
  ``ModelCheckpoint``), ``legacy_h5_format.save_model_to_hdf5`` (``.h5``),
  ``SavedModelExportArchive.write_out`` (``Model.export``, ``keras.export.ExportArchive``);
- ``BackupAndRestore._save_model`` and ``on_train_end``: the whole backup
  directory is one write (a worker that is not the chief backs up into a private
  directory; every worker restores from ``backup_dir``, the chief's state; only
  the chief deletes it at the end); a callback marked with
  :func:`~tfstrategy.multiworker.chief_files.keep_per_worker` (``tfstrategy.backup_callbacks()``,
  one directory per worker) keeps Keras' behaviour;
- ``CSVLogger.on_train_begin``/``on_train_end`` (the file is open for the whole of ``fit``);
- ``TensorBoard.set_model``/``on_train_end`` (the event files);
- ``file_utils.makedirs``: an existing directory is not an error in a multi-worker
  job (Keras tests ``exists`` first; another worker may create it in between);
- ``file_utils.urlretrieve`` (``keras.utils.get_file``, ``keras.datasets.*.load_data()``, which
  every worker calls into one cache on a shared home): each download goes to a part file renamed
  into place, so a worker never reads another's half-finished download (extracting an archive
  is not covered).

Each replacement runs Keras' own code unchanged outside a multi-worker
``TF_CONFIG``. The probe runs the *original* writers against a stand-in model
whose strategy is a non-chief worker of a multi-worker MultiWorkerMirroredStrategy
(no cluster, no TensorFlow op): a writer is broken if it still writes the real path.
tf_keras keeps its own logic and is never patched.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.multiworker import chief_files
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model

SAVE_MODEL = "saving.saving_lib.save_model"
SAVE_WEIGHTS = "saving.saving_lib.save_weights_only"
SAVE_H5 = "legacy.saving.legacy_h5_format.save_model_to_hdf5"
EXPORT = "export.saved_model_export_archive.SavedModelExportArchive.write_out"
#: Model.export's writer before it moved to its own module (Keras 3.10); one of the two exists.
EXPORT_ARCHIVE = "export.saved_model.ExportArchive.write_out"
MAKEDIRS = "utils.file_utils.makedirs"
DOWNLOAD = "utils.file_utils.urlretrieve"
BACKUP_SAVE = _compat.backup_save_target()
BACKUP_END = "callbacks.backup_and_restore.BackupAndRestore.on_train_end"
CSV_BEGIN = "callbacks.csv_logger.CSVLogger.on_train_begin"
CSV_END = "callbacks.csv_logger.CSVLogger.on_train_end"
TENSORBOARD_SET = "callbacks.tensorboard.TensorBoard.set_model"
TENSORBOARD_END = "callbacks.tensorboard.TensorBoard.on_train_end"

#: Where a callback keeps its private directory on a worker that is not the chief.
_PRIVATE = "_tfstrategy_private_dir"


def _model_writer(original: Callable[..., object]) -> Callable[..., object]:
    """``original(model_or_self, filepath, ...)`` writing where :func:`chief_write` says."""

    @functools.wraps(original)
    def write(owner: object, filepath: object, *args: object, **kwargs: object) -> object:
        with chief_files.chief_write(filepath) as target:
            return original(owner, target, *args, **kwargs)

    return write


def _atomic_download(original: Callable[..., object]) -> Callable[..., object]:
    """Download into a private part file and rename it into place, so no worker reads a partial download."""

    @functools.wraps(original)
    def urlretrieve(url: Any, filename: Any = None, *args: object, **kwargs: object) -> object:
        config = chief_files.shared_job()
        if config is None or filename is None:
            return original(url, filename, *args, **kwargs)
        target = os.fspath(filename)
        part = f"{target}.{config.task_name}-{os.getpid()}.part"
        try:
            result = original(url, part, *args, **kwargs)
            os.replace(part, target)  # atomic: every reader sees no file or a whole one
        finally:
            if os.path.exists(part):
                os.remove(part)
        return (target, *result[1:]) if isinstance(result, tuple) else result

    return urlretrieve


def _tolerant_makedirs(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def makedirs(path: Any) -> object:
        try:
            return original(path)
        except FileExistsError:
            if os.path.isdir(path) and chief_files.shared_job() is not None:
                return None  # another worker created it after Keras' own exists() test
            raise

    return makedirs


@contextlib.contextmanager
def _backup_paths(callback: Any, directory: str) -> Iterator[None]:
    """``callback``'s backup files under ``directory`` for the block (the instance attributes Keras reads)."""
    files = _compat.backup_file_attributes()
    real = {name: getattr(callback, name) for name in ("backup_dir", *files) if hasattr(callback, name)}
    root = real["backup_dir"]
    try:
        callback.backup_dir = directory
        for name in files:
            if name in real:
                setattr(callback, name, os.path.join(directory, os.path.relpath(real[name], root)))
        yield
    finally:
        for name, value in real.items():
            setattr(callback, name, value)


def _backup_writer(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def backup_step(self: Any, *args: object, **kwargs: object) -> object:
        if chief_files.is_per_worker(self):  # backup_callbacks(): a directory per worker already
            with chief_files.passing_through():
                return original(self, *args, **kwargs)
        directory = os.fspath(self.backup_dir)
        with chief_files.chief_write(directory) as target:
            if target == directory:
                return original(self, *args, **kwargs)
            with _backup_paths(self, target):
                return original(self, *args, **kwargs)

    return backup_step


def _csv_begin(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def on_train_begin(self: Any, logs: Logs = None) -> object:
        config = chief_files.shared_job()
        if config is None or config.is_chief:
            return original(self, logs)
        chief_files.remove_private_directory(getattr(self, _PRIVATE, None))
        private = chief_files.private_directory(config)
        setattr(self, _PRIVATE, private)
        real = self.filename
        self.filename = os.path.join(private, os.path.basename(os.fspath(real)))
        try:
            return original(self, logs)
        finally:
            self.filename = real

    return on_train_begin


def _csv_end(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def on_train_end(self: Any, logs: Logs = None) -> object:
        # The chief's log is complete (closed) before on_train_end returns on any worker.
        with chief_files.chief_write(os.fspath(self.filename)):
            try:
                return original(self, logs)
            finally:
                chief_files.remove_private_directory(getattr(self, _PRIVATE, None))
                setattr(self, _PRIVATE, None)

    return on_train_end


def _tensorboard_set_model(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def set_model(self: Any, model: Model) -> object:
        config = chief_files.shared_job()
        if config is None or config.is_chief:
            return original(self, model)
        private = getattr(self, _PRIVATE, None) or chief_files.private_directory(config)
        setattr(self, _PRIVATE, private)
        real = self.log_dir
        self.log_dir = os.path.join(private, os.path.basename(os.fspath(real).rstrip("/")) or "logs")
        try:
            return original(self, model)
        finally:
            self.log_dir = real  # what the script reads back; the writers use the private copy

    return set_model


def _tensorboard_end(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def on_train_end(self: object, logs: Logs = None) -> object:
        try:
            return original(self, logs)
        finally:
            private = getattr(self, _PRIVATE, None)
            if private is not None:
                chief_files.remove_private_directory(private)
                setattr(self, _PRIVATE, None)

    return on_train_end


_REPLACEMENTS: dict[str, Callable[[Callable[..., object]], Callable[..., object]]] = {
    SAVE_MODEL: _model_writer,
    SAVE_WEIGHTS: _model_writer,
    SAVE_H5: _model_writer,
    EXPORT: _model_writer,
    EXPORT_ARCHIVE: _model_writer,
    MAKEDIRS: _tolerant_makedirs,
    DOWNLOAD: _atomic_download,
    BACKUP_SAVE: _backup_writer,
    BACKUP_END: _backup_writer,
    CSV_BEGIN: _csv_begin,
    CSV_END: _csv_end,
    TENSORBOARD_SET: _tensorboard_set_model,
    TENSORBOARD_END: _tensorboard_end,
}


def stand_in_worker_model(saved: list[str] | None = None) -> object:
    """A Keras 3 model whose strategy is worker 1 of a 2-worker MultiWorkerMirroredStrategy (no cluster, no op)."""
    import keras

    distribute = tf().distribute

    class _Worker1(distribute.MultiWorkerMirroredStrategy):  # type: ignore[name-defined]  # an untyped TensorFlow/Keras class
        def __init__(self) -> None:  # the real constructor would start a server and wait for peers
            self._stand_in_extended = _compat.multi_worker_extended_stand_in(
                "/job:worker/replica:0/task:1/device:CPU:0", should_checkpoint=False, should_save_summary=False)

        @property
        def extended(self) -> object:
            return self._stand_in_extended

        def scope(self) -> object:
            return contextlib.nullcontext()

    class _Model(keras.Sequential):
        def save_weights(self, filepath: Any, overwrite: bool = True, **kwargs: object) -> None:
            if saved is None:
                super().save_weights(filepath, overwrite=overwrite, **kwargs)
                return
            saved.append(os.fspath(filepath))

    model = _Model(name="tfstrategy_probe")  # named: the script's first model is still 'sequential'
    model.built = True  # no layers, no variables: saving writes a file without starting the runtime
    _compat.set_model_strategy(model, _Worker1())
    return model


class ChiefFilesPatch(Patch):
    """Keras 3's file writers: only the chief of a multi-worker job writes the named path."""

    name = "keras_chief_files"
    change_text = "Keras' files written by the chief only"
    upstream = "keras-team/keras: Keras 3 has no distributed_file_utils (tf_keras wrote non-chief files to temp copies)"
    verified_up_to = "3.15.1"
    targets = tuple(_REPLACEMENTS)
    #: Targets of which the installed Keras has exactly one (the first that exists is patched).
    one_of = ((EXPORT, EXPORT_ARCHIVE),)

    def target_module(self) -> Any:
        return _compat.keras3_file_writers()

    def present_targets(self) -> tuple[str, ...]:
        """The targets this Keras has: every one but the alternatives it lacks (see ``one_of``)."""
        module = self.target_module()
        if module is None:
            return ()
        lacking: set[str] = set()
        for group in self.one_of:
            found = [target for target in group if self._has(module, target)]
            lacking |= set(group) - set(found[:1])
        return tuple(target for target in self.targets if target not in lacking)

    def run_probe(self, module: ModuleType) -> ProbeResult:
        with tempfile.TemporaryDirectory(prefix="tfstrategy-probe-") as scratch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            root = Path(scratch)
            return ProbeResult({**self._probe_model_writers(root), **self._probe_callbacks(module, root),
                                MAKEDIRS: self._probe_makedirs(root), DOWNLOAD: self._probe_download(root)})

    def _probe_model_writers(self, root: Path) -> dict[str, bool]:
        model = stand_in_worker_model()
        self.original(SAVE_MODEL)(model, str(root / "m.keras"))
        self.original(SAVE_WEIGHTS)(model, str(root / "m.weights.h5"))
        model_broken = (root / "m.keras").exists()
        # Keras routes .h5 and export the same way as .keras (no role check anywhere): probing
        # them would need traced functions, hence a started runtime.
        exports = [target for target in (EXPORT, EXPORT_ARCHIVE) if target in self.present_targets()]
        return {SAVE_MODEL: model_broken, SAVE_WEIGHTS: (root / "m.weights.h5").exists(),
                SAVE_H5: model_broken, **dict.fromkeys(exports, model_broken)}

    def _probe_callbacks(self, module: ModuleType, root: Path) -> dict[str, bool]:
        callbacks = module.callbacks
        saved: list[str] = []
        model = stand_in_worker_model(saved)

        backup = callbacks.backup_and_restore.BackupAndRestore(str(root / "backup"))
        backup.set_model(model)
        self.original(BACKUP_SAVE)(backup)
        backup_broken = bool(saved) and saved[0].startswith(str(root / "backup"))

        logger = callbacks.csv_logger.CSVLogger(str(root / "log.csv"))
        logger.set_model(model)
        self.original(CSV_BEGIN)(logger)
        self.original(CSV_END)(logger)
        csv_broken = (root / "log.csv").exists()

        board = callbacks.tensorboard.TensorBoard(log_dir=str(root / "logs"), write_graph=False, profile_batch=0)
        self.original(TENSORBOARD_SET)(board, model)
        board_broken = os.fspath(_compat.tensorboard_write_dir(board)) == str(root / "logs")
        return {BACKUP_SAVE: backup_broken, BACKUP_END: backup_broken, CSV_BEGIN: csv_broken, CSV_END: csv_broken,
                TENSORBOARD_SET: board_broken, TENSORBOARD_END: board_broken}

    def _probe_makedirs(self, root: Path) -> bool:
        try:
            self.original(MAKEDIRS)(str(root))
        except FileExistsError:
            return True
        return False

    def _probe_download(self, root: Path) -> bool:
        """Whether a download (a file:// URL: no network) writes its target in place, readable half done."""
        source, target = root / "source.bin", root / "downloaded.bin"
        source.write_bytes(b"x" * 65536)
        seen = []
        self.original(DOWNLOAD)(source.as_uri(), str(target), lambda *_: seen.append(target.exists()))
        return any(seen)

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        fixed = _REPLACEMENTS[target](original)

        @functools.wraps(fixed)
        def noting(*args: object, **kwargs: object) -> object:
            if chief_files.shared_job() is not None:  # a multi-worker job: the writer now acts as the chief's
                self.acted()
            return fixed(*args, **kwargs)

        return noting


PATCH = ChiefFilesPatch()
