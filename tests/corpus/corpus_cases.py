"""The corpus: real-shaped public scripts, how each is run, and what each run must do.

Every script under ``scripts/`` imitates a public one (its docstring names it) with synthetic data
of the same shapes and dtypes. Each runs three ways, each in a fresh working directory:

- ``plain``: ``python script.py``;
- ``run``: ``tfstrategy run --cpu-replicas 2 -- python script.py``;
- ``launch``: ``tfstrategy launch -n 2 -- python script.py``.

``CASES`` states the correct outcome of each (``Trains``, ``Refused`` or ``Fails``) and the files a
training run leaves behind. ``tf2`` (plain TensorFlow's own two processes with ``TF_CONFIG``, no
tfstrategy) is not a tfstrategy outcome: it is measured by ``measure.py`` and recorded in each case's
``plain_tf_two_workers`` so the guide can say what plain TensorFlow does with the same script.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from helpers import free_ports

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MODES = ("plain", "run", "launch")
#: Relative tolerance for "the same final loss/weights as another mode on the same global batch":
#: one process with 2 replicas and 2 workers with 1 replica each sum gradients in another order.
RTOL = 1e-4
#: Every process is bounded in time: a hung run fails its test instead of hanging CI.
RUN_SECONDS = 420
#: The class names of one multi-worker job's strategy (TensorFlow's MWMS is a CollectiveAllReduceStrategy).
ONE_JOB = ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy")
STARTING = re.compile(r"tfstrategy launch: starting \d+ worker")
#: The hook's exit summary: the strategies created first (``MirroredStrategy, 2 replicas``, ``X (refused)``,
#: ``no strategy created``), then what changed, each part after "; ".
_STRATEGY = r"[A-Z]\w*(?: with a device list)?(?:, \d+ replicas?)?(?: \(refused\))?"
SUMMARY_LINE = re.compile(rf"^tfstrategy: (?:no strategy created|{_STRATEGY}(?:, {_STRATEGY})*)(?:; |$)")
FINAL = re.compile(r"^(?:\[worker (\d+)\] )?final loss (\S+) weights (\S+) replicas (\d+) strategy (\w+)\s*$")


class Final(NamedTuple):
    """A script's last line: ``final loss L weights W replicas R strategy NAME``."""

    loss: float
    weights: float
    replicas: int
    strategy: str


@dataclass(frozen=True)
class Trains:
    """Exit 0 and a ``final loss ... weights ...`` line from every worker, all equal.

    ``workers`` > 1: one job, i.e. every worker's strategy is a MultiWorkerMirroredStrategy with
    ``replicas`` replicas in sync (N workers each training alone on all the data would print the
    same loss: only the strategy tells them apart).
    ``same_as``: the mode whose final loss and weight checksum this run must equal (within
    ``RTOL``): the script's data and global batch are the same there. ``stderr``: a pattern the
    run's stderr must contain (e.g. the summary naming the strategy). ``race``: a pattern for the
    one failure the script's own code allows (two workers creating one directory without
    ``exist_ok``): the run may fail instead, if tfstrategy's first line names that path.
    """

    workers: int = 1
    replicas: int | None = None
    same_as: str | None = None
    stderr: str | None = None
    race: str | None = None


@dataclass(frozen=True)
class Refused:
    """Exit non-zero before training; the first ``tfstrategy`` line on stderr matches ``cause``.

    ``why``: the reason, in words, for the guide.
    """

    cause: str
    why: str = ""


@dataclass(frozen=True)
class Fails:
    """The script's own error, the same as plain TensorFlow's (``error`` in its output)."""

    error: str


Outcome = Trains | Refused | Fails


@dataclass(frozen=True)
class Case:
    """One script, its arguments, the source it imitates, and the outcome of each mode.

    ``files`` maps a glob (relative to the working directory) to how many files it must match when
    the script trained: an int, or ``"plain"`` for as many as the plain run wrote. Every file the run
    leaves must match one glob (no temporary copies, no second copy), and each must be complete.
    ``inputs`` are globs of files the script writes as its own input data (not checked). A mode
    whose outcome is ``None`` is not run: ``skip_reason`` says why it adds nothing.

    ``known`` lists the modes that do not yet do what is stated, at this commit: mode -> (a pattern
    the failure must match, why it fails). The test holds them to that failure, and fails the day
    one passes, so the table is updated with the fix. ``plain_tf_two_workers`` is what plain
    TensorFlow's own two-process run does (measured with ``measure.py --modes tf2``).
    """

    id: str
    script: str
    source: str
    plain: Outcome | None
    run: Outcome | None
    launch: Outcome | None
    files: Mapping[str, int | str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    skip_reason: str = ""
    known: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    plain_tf_two_workers: str = ""

    def outcome(self, mode: str) -> Outcome | None:
        return getattr(self, mode)


RACE_CKPT = r"ckpt"
#: What the scope audit says about variables made outside the scope (a finding).
AUDIT_FINDING = re.compile(r"variables were not created in the scope of|found variables outside the scope")
#: What the launcher says of a job that hangs or lags (issue 38): never of a script that trains as it should.
LAUNCHER_CAUSE = re.compile(r"^tfstrategy launch: (stall: |warning: worker \d+ is a straggler|.*before joining)", re.M)

CASES: tuple[Case, ...] = (
    Case(
        id="keras-fault-tolerance",
        script="keras_fault_tolerance.py",
        source="Keras guide: multi-GPU distributed training with TensorFlow (fault tolerance: ModelCheckpoint ./ckpt/ckpt-{epoch}.keras, load_model of the newest)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2, same_as="plain"),
        launch=Trains(workers=2, replicas=2, same_as="run", race=RACE_CKPT),
        files={"ckpt/ckpt-1.keras": 1},
        plain_tf_two_workers='fails at random: one worker reads the checkpoint the other is writing (`File not found: ./ckpt/ckpt-1.keras`, `BadZipFile`)',
    ),
    Case(
        id="tf-distributed-keras",
        script="tf_distributed_keras.py",
        source="TF tutorial: distributed training with Keras (TF ops before MirroredStrategy; TensorBoard, weights-only ModelCheckpoint, load newest, save/load_model)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        files={"training_checkpoints/ckpt_0001.weights.h5": 1, "training_checkpoints/ckpt_0002.weights.h5": 1,
               "logs/train/events.out.tfevents.*": 1, "my_model.keras": 1},
        plain_tf_two_workers='exit 0, but each worker trains alone (`MirroredStrategy`) and writes every file itself',
    ),
    Case(
        id="tf-custom-training",
        script="tf_custom_training.py",
        source="TF tutorial: custom training with tf.distribute.Strategy (experimental_distribute_dataset, tf.train.Checkpoint)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        files={"training_checkpoints/checkpoint": 1, "training_checkpoints/ckpt-1.index": 1,
               "training_checkpoints/ckpt-1.data-00000-of-00001": 1, "training_checkpoints/ckpt-2.index": 1,
               "training_checkpoints/ckpt-2.data-00000-of-00001": 1},
        plain_tf_two_workers='exit 0, but each worker trains alone and saves the same checkpoint',
    ),
    Case(
        id="tf-input-from-function",
        script="tf_input_from_function.py",
        source="TF tutorial: distributed input (distribute_datasets_from_function, StringLookup made in the scope)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2, same_as="plain"),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="keras-multi-worker-backup",
        script="keras_multi_worker_backup.py",
        source="TF tutorial: multi-worker training with Keras (MWMS, BackupAndRestore on one directory, chief-only save)",
        plain=Trains(replicas=1),
        run=Trains(same_as="plain"),
        launch=Trains(workers=2, replicas=2),
        files={"keras-model.keras": 1, "ckpt/checkpoint": 1, "ckpt/ckpt-1.index": 1,
               "ckpt/ckpt-1.data-00000-of-00001": 1},
        plain_tf_two_workers='fails: `ValueError: Attempt to convert a value (PerReplica...)` (Keras 3 under MultiWorkerMirroredStrategy, [upstream bugs](../reference/upstream-bugs.md))',
    ),
    Case(
        id="tf-text-classification",
        script="tf_text_classification.py",
        source="TF tutorial: basic text classification (TextVectorization adapted before MirroredStrategy; export model [vectorize_layer, model, sigmoid] on raw strings)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2),
        launch=Trains(workers=2, replicas=2),
        inputs=("data/*",),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="structured-preprocessing",
        script="structured_preprocessing.py",
        source="TF tutorial: structured data with Keras preprocessing layers (Normalization, StringLookup, IntegerLookup adapted in the scope)",
        plain=Trains(replicas=1),
        run=Trains(replicas=2),
        launch=Trains(workers=2, replicas=2),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="keras-callbacks-writers",
        script="keras_callbacks_writers.py",
        source="Keras guide: training & evaluation with built-in methods (callbacks, checkpointing) + TF tutorial: save and load models",
        plain=Trains(replicas=1),
        run=Trains(replicas=2, same_as="plain"),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        files={"mymodel_*.keras": "plain", "training_2/cp-*.weights.h5": "plain", "logs/train/events.out.tfevents.*": 1,
               "logs/validation/events.out.tfevents.*": 1, "training.log": 1,
               "checkpoints/my_checkpoint.weights.h5": 1, "my_model.keras": 1},
        plain_tf_two_workers='exit 0, but each worker trains alone and writes every file itself',
    ),
    Case(
        id="mixed-precision-guide",
        script="mixed_precision_guide.py",
        source="TF guide / Keras guide: mixed precision (mixed_float16, no strategy, fit with validation_split)",
        plain=Trains(replicas=1),
        run=Trains(replicas=1, same_as="plain"),
        launch=Refused(r"Model\.fit\(\).*without a strategy", why="fit without a strategy: each worker would train alone"),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="xla-jit-custom-loop",
        script="xla_jit_custom_loop.py",
        source="TF XLA tutorial: tf.function(jit_compile=True) train step, run through MirroredStrategy.run",
        plain=Trains(replicas=1),
        run=Trains(replicas=2, same_as="plain"),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        known={"run": (r"Trying to access resource .* located in device",
                     "XLA places a jit_compile'd replica function on CPU:0: the logical CPU replicas of "
                     "--cpu-replicas cannot run it (TensorFlow's XLA known issue; plain TensorFlow the same)"),
               "launch": (r"implemented for CPU devices when compiling with XLA",
                        "TensorFlow cannot compile a multi-worker collective with XLA on CPU devices (b/194942685): "
                        "the workers abort (SIGABRT); on GPUs it compiles")},
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="model-garden-gpu-default",
        script="model_garden_mnist.py",
        source="TF Model Garden: mnist_main.py + distribute_utils.get_distribution_strategy (default --num_gpus=1: devices=['device:GPU:0'])",
        plain=Trains(replicas=1),
        run=Refused(r"(?i)gpu:0", why="this host has no GPU:0"),
        launch=Refused(r"(?i)gpu:0", why="this host has no GPU:0"),
        files={"model_dir/model.ckpt-0001.weights.h5": 1, "model_dir/model.ckpt-0002.weights.h5": 1,
               "model_dir/train/events.out.tfevents.*": 1, "model_dir/validation/events.out.tfevents.*": 1,
               "model_dir/saved_model.keras": 1},
        plain_tf_two_workers='exit 0: each worker trains alone, on the CPU, without a word about the missing GPU',
    ),
    Case(
        id="model-garden-cpu",
        script="model_garden_mnist.py",
        args=("--num_gpus=0",),
        source="TF Model Garden: mnist_main.py with --num_gpus=0 (devices=['device:CPU:0'], ModelCheckpoint weights-only and model.save into --model_dir)",
        plain=Trains(replicas=1),
        run=Trains(replicas=1, same_as="plain", stderr=r"(?i)cpu-replicas"),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        files={"model_dir/model.ckpt-0001.weights.h5": 1, "model_dir/model.ckpt-0002.weights.h5": 1,
               "model_dir/train/events.out.tfevents.*": 1, "model_dir/validation/events.out.tfevents.*": 1,
               "model_dir/saved_model.keras": 1},
        plain_tf_two_workers='exit 0, but each worker trains alone and writes every file itself',
    ),
    Case(
        id="explicit-cpu-devices",
        script="explicit_cpu_devices.py",
        source="Keras distribute_test.py / TF GPU guide: logical CPUs split by the script, MirroredStrategy(['CPU:0', 'CPU:1'])",
        plain=Trains(replicas=2),
        run=Trains(replicas=2, same_as="plain"),
        launch=Refused(r"refused MirroredStrategy\(devices=", why="a list MultiWorkerMirroredStrategy cannot honour: each worker would train alone"),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
    Case(
        id="parameter-server",
        script="parameter_server_inprocess.py",
        source="TF tutorial: parameter server training (in-process cluster, ParameterServerStrategy, ClusterCoordinator)",
        plain=Trains(),
        run=Trains(stderr=r"ParameterServerStrategy"),
        launch=Refused(r"refused ParameterServerStrategy", why="ParameterServerStrategy is not supported yet"),
        plain_tf_two_workers='exit 0: each worker runs a cluster of its own',
    ),
    Case(
        id="kubeflow-mwms-keras",
        script="kubeflow_mwms_keras.py",
        args=("--saved_model_dir", "./saved_model", "--checkpoint_dir", "./ckpt"),
        source="Kubeflow training-operator: TFJob multi_worker_strategy-with-keras.py (TF_CONFIG task index, MWMS, ModelCheckpoint, chief export)",
        plain=Fails(r"KeyError: 'task'"),
        run=None,
        launch=Trains(workers=2, replicas=2),
        skip_reason="run: like plain, the script itself needs TF_CONFIG (KeyError: 'task' before any TensorFlow)",
        files={"ckpt/ckpt_1.weights.h5": 1, "ckpt/ckpt_2.weights.h5": 1, "logs/train/events.out.tfevents.*": 1,
               "saved_model/saved_model.pb": 1, "saved_model/fingerprint.pb": 1, "saved_model/variables/*": 2},
        plain_tf_two_workers='fails: `ValueError: Attempt to convert a value (PerReplica...)` (Keras 3 under MultiWorkerMirroredStrategy)',
    ),
    Case(
        id="tfrecord-subprocess",
        script="tfrecord_pipeline.py",
        source="Model Garden-style converter subprocess (imports TensorFlow) + TF tutorial: TFRecord and tf.train.Example",
        plain=Trains(replicas=1),
        run=Trains(replicas=2, same_as="plain"),
        launch=Trains(workers=2, replicas=2, same_as="run"),
        inputs=("data/*",),
        plain_tf_two_workers='exit 0, but each worker trains alone',
    ),
)


# --- running -------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one run of a script did: exit status, output, final lines, the files it left."""

    mode: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    workdir: Path
    finals: dict[int, Final] = field(default_factory=dict)

    @property
    def tfstrategy_lines(self) -> list[str]:
        """tfstrategy's own stderr lines, without the launcher's "starting N worker(s)" notice."""
        return [line for line in self.stderr.splitlines()
                if line.startswith("tfstrategy") and not STARTING.match(line)]

    @property
    def summaries(self) -> list[str]:
        """The run's exit summary lines (``tfstrategy: <strategies>; <what changed>; ...``)."""
        return [line for line in self.stderr.splitlines() if SUMMARY_LINE.match(line)]


def clean_environment() -> dict[str, str]:
    """This environment without tfstrategy's or TensorFlow's job variables, TensorFlow quiet."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("TFSTRATEGY_", "TF_CONFIG", "SLURM_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(case: Case, mode: str) -> list[str]:
    script = [sys.executable, str(SCRIPTS / case.script), *case.args]
    if mode == "plain":
        return script
    if mode == "run":
        return [sys.executable, "-m", "tfstrategy", "run", "--cpu-replicas", "2", "--", *script]
    if mode == "launch":
        return [sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--timeout", "240", "--console-workers", "all", "--", *script]
    raise ValueError(f"Received mode {mode!r}; expected one of {MODES} or 'tf2'")


def _bounded(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    process = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\ncorpus: killed after {RUN_SECONDS} s"
    return process.returncode, out, err


def run_case(case: Case, mode: str, workdir: Path) -> Result:
    """Run ``case`` in ``mode`` with ``workdir`` (fresh, empty) as its working directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if mode == "tf2":
        code, out, err = _plain_two_workers(case, workdir)
    else:
        code, out, err = _bounded(command(case, mode), workdir, clean_environment())
    result = Result(mode, code, out, err, time.monotonic() - started, workdir)
    for line in out.splitlines():
        match = FINAL.match(line)
        if match:
            worker, loss, weights, replicas, strategy = match.groups()
            result.finals[int(worker or 0)] = Final(float(loss), float(weights), int(replicas), strategy)
    return result


def _plain_two_workers(case: Case, workdir: Path) -> tuple[int, str, str]:
    """Plain TensorFlow's own way: two processes with a TF_CONFIG each, no tfstrategy at all."""
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes, logs = [], []
    for index in range(2):
        logs.append(tempfile.TemporaryFile("w+"))
        env = {**clean_environment(), "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}
        processes.append(subprocess.Popen([sys.executable, str(SCRIPTS / case.script), *case.args], cwd=workdir,
                                          env=env, text=True, stdout=logs[-1], stderr=subprocess.STDOUT,
                                          start_new_session=True))
    outputs, codes = [], []
    deadline = time.monotonic() + RUN_SECONDS
    for index, (process, log) in enumerate(zip(processes, logs)):
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            process.wait()
        log.seek(0)
        out = log.read()
        log.close()
        outputs.append("".join(f"[worker {index}] {line}\n" for line in out.splitlines()))
        codes.append(process.returncode)
    first_failure = next((code for code in codes if code != 0), 0)
    return first_failure, "".join(outputs), ""


# --- checking ------------------------------------------------------------------------------------


def left_files(result: Result, case: Case) -> list[str]:
    """Files the run left in its working directory, relative, without the script's own inputs."""
    files = []
    for path in sorted(result.workdir.rglob("*")):
        if path.is_file():
            relative = path.relative_to(result.workdir).as_posix()
            if not any(fnmatch.fnmatch(relative, pattern) for pattern in case.inputs):
                files.append(relative)
    return files


def incomplete(path: Path) -> str | None:
    """Why ``path`` is not a complete file of its kind (None when it is)."""
    if path.stat().st_size == 0:
        return "empty"
    name = path.name
    if name.endswith(".keras"):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            return f"corrupt member {bad}" if bad else None
        except (zipfile.BadZipFile, OSError) as error:
            return f"not a complete .keras archive ({error})"
    if name.endswith(".h5"):
        import h5py

        try:
            with h5py.File(path, "r") as handle:
                handle.visit(lambda _: None)
        except OSError as error:
            return f"not a complete HDF5 file ({error})"
    return None


def check(case: Case, mode: str, result: Result, plain_result: Result | None = None,
          references: Mapping[str, Result] | None = None) -> list[str]:
    """Every way ``result`` differs from the outcome ``case`` states for ``mode`` (empty: correct)."""
    outcome = case.outcome(mode)
    problems: list[str] = []
    tail = (result.stdout[-2500:] + "\n--- stderr ---\n" + result.stderr[-2500:]).strip()
    if isinstance(outcome, Refused):
        lines = result.tfstrategy_lines
        if result.returncode == 0:
            problems.append(f"expected a refusal ({outcome.cause!r}), got exit 0")
        elif not lines or not re.search(outcome.cause, lines[0]):
            problems.append(f"expected the first tfstrategy line to match {outcome.cause!r}, got {lines[:1]}")
        if result.finals:
            problems.append("expected no training, got final lines")
    elif isinstance(outcome, Fails):
        if result.returncode == 0 or not re.search(outcome.error, result.stdout + result.stderr):
            problems.append(f"expected the script's own error {outcome.error!r}, got exit {result.returncode}")
    elif isinstance(outcome, Trains):
        if result.returncode != 0:
            if outcome.race and result.tfstrategy_lines and re.search(outcome.race, result.tfstrategy_lines[0]):
                return []  # the script's own race on that path, named as such
            return [f"expected training to succeed, got exit {result.returncode}: {_last_error(result)}", tail]
        problems += _check_training(case, mode, outcome, result, references or {})
        problems += _check_files(case, result, plain_result)
    if problems:
        problems.append(tail)
    return problems


def _last_error(result: Result) -> str:
    lines = [line for line in (result.stdout + "\n" + result.stderr).splitlines()
             if re.search(r"\w+(Error|Exception|Exit)\b:", line)]
    return lines[-1].strip().lstrip("| ") if lines else "(no error line)"


def _check_training(case: Case, mode: str, outcome: Trains, result: Result,
                    references: Mapping[str, Result]) -> list[str]:
    problems = []
    if sorted(result.finals) != list(range(outcome.workers)):
        return [f"expected a final line from worker(s) {list(range(outcome.workers))}, got {sorted(result.finals)}"]
    values = set(result.finals.values())
    if len(values) != 1:
        problems.append(f"expected the same final loss and weights on every worker, got {result.finals}")
    loss, weights, replicas, strategy = result.finals[0]
    if outcome.workers > 1 and strategy not in ONE_JOB:
        problems.append(f"expected one job of {outcome.workers} workers, got each worker training alone with {strategy}")
    if outcome.replicas is not None and replicas != outcome.replicas:
        problems.append(f"expected {outcome.replicas} replica(s) in sync, got {replicas} ({strategy})")
    if not (math.isfinite(loss) and math.isfinite(weights)):
        problems.append(f"expected a finite final loss and weights, got {loss}, {weights}")
    if outcome.same_as:
        reference = references.get(outcome.same_as)
        if outcome.same_as in case.known:
            pass  # that mode does not train yet (Case.known): nothing to compare with
        elif reference is None or not reference.finals:
            problems.append(f"no {outcome.same_as} run to compare with")
        else:
            ref_loss, ref_weights = reference.finals[0][:2]
            if not (math.isclose(loss, ref_loss, rel_tol=RTOL) and math.isclose(weights, ref_weights, rel_tol=RTOL)):
                problems.append(f"expected final loss/weights {ref_loss}/{ref_weights} as {outcome.same_as} "
                                f"(same global batch), got {loss}/{weights}")
    if outcome.stderr and not re.search(outcome.stderr, result.stderr):
        problems.append(f"expected stderr to mention {outcome.stderr!r}")
    if mode == "run" and len(result.summaries) != 1:
        problems.append(f"expected one exit summary line, got {len(result.summaries)}: {result.summaries}")
    findings = [line for line in (result.stdout + result.stderr).splitlines() if AUDIT_FINDING.search(line)]
    if findings:
        problems.append(f"the audit reported a finding on a valid script: {findings}")
    causes = [match.group(0) for match in LAUNCHER_CAUSE.finditer(result.stderr)] if mode == "launch" else []
    if causes:
        problems.append(f"the launcher named a stall or a straggler in a job that trained as it should: {causes}")
    return problems


def _check_files(case: Case, result: Result, plain_result: Result | None) -> list[str]:
    problems = []
    files = left_files(result, case)
    unmatched = [name for name in files if not any(fnmatch.fnmatch(name, pattern) for pattern in case.files)]
    if unmatched:
        problems.append(f"files no one asked for (temporary copies, second copies): {unmatched}")
    plain_files = left_files(plain_result, case) if plain_result is not None else None
    for pattern, count in case.files.items():
        matched = [name for name in files if fnmatch.fnmatch(name, pattern)]
        if count == "plain":
            if plain_files is None:
                problems.append(f"no plain run to count {pattern} against")
                continue
            count = len([name for name in plain_files if fnmatch.fnmatch(name, pattern)])
        if len(matched) != count:
            problems.append(f"expected {count} file(s) {pattern}, got {matched}")
        for name in matched:
            why = incomplete(result.workdir / name)
            if why:
                problems.append(f"{name}: {why}")
    if plain_result is not None:
        for name in files:
            if name.endswith((".log", ".csv")) and (plain_result.workdir / name).is_file():
                lines, plain_lines = (len((root / name).read_text().splitlines())
                                      for root in (result.workdir, plain_result.workdir))
                if lines != plain_lines:
                    problems.append(f"{name}: {lines} lines where the plain run wrote {plain_lines} (two writers?)")
    return problems


def describe(case: Case, mode: str) -> str:
    """The stated outcome of ``mode`` in words, for the guide's table."""
    outcome = case.outcome(mode)
    if outcome is None:
        return "not run"
    if isinstance(outcome, Refused):
        return "refused in one line" + (f" ({outcome.why})" if outcome.why else "")
    if isinstance(outcome, Fails):
        return f"the script's own error ({outcome.error.replace(chr(92), '')})"
    text = "trains" if outcome.workers == 1 else f"one job of {outcome.workers} workers"
    if outcome.replicas:
        text += f", {outcome.replicas} replica{'s' if outcome.replicas > 1 else ''}"
    if outcome.same_as:
        text += f", loss = {outcome.same_as}"
    if case.files:
        text += ", each file once"
    if outcome.stderr:
        text += f", says `{outcome.stderr.replace('(?i)', '')}`"
    if outcome.race:
        text += " (or the script's own makedirs race on ckpt, named in one line)"
    return text


def guide_table() -> str:
    """The corpus table of docs/guides/unchanged-scripts.md, from ``CASES`` (a test keeps them equal)."""
    lines = ["| case (`tests/corpus/scripts/`) | imitates | plain | `run --cpu-replicas 2` | `launch -n 2` | "
             "plain TensorFlow, 2 processes with `TF_CONFIG` |",
             "| --- | --- | --- | --- | --- | --- |"]
    for case in CASES:
        cells = []
        for mode in MODES:
            text = describe(case, mode)
            if case.outcome(mode) is None and case.skip_reason.startswith(f"{mode}:"):
                text += f" ({case.skip_reason.split(':', 1)[1].strip()})"
            if mode in case.known:
                text += f"; **not yet**: {case.known[mode][1]}"
            cells.append(text)
        script = case.script + (" " + " ".join(case.args) if case.args else "")
        lines.append(f"| {case.id} (`{script}`) | {case.source} | " + " | ".join(cells)
                     + f" | {case.plain_tf_two_workers or 'not measured'} |")
    return "\n".join(lines) + "\n"
