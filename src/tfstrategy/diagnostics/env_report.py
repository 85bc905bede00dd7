"""The environment report behind ``tfstrategy env``: where this host and process stand.

:func:`collect_env_report` gathers the facts a bug report needs (versions, the
Keras flavour, TensorFlow's build, devices, ``CUDA_VISIBLE_DEVICES``,
``TF_CONFIG``, Slurm, and what ``select()`` would choose) into an
:class:`EnvReport`; :func:`format_env_report` and :func:`env_report_as_dict`
turn it into copy-pasteable lines or JSON without touching TensorFlow.

Collecting must leave the user's process as it found it: it only reads
physical devices, their visibility and logical configuration, and the build
info, none of which start the TensorFlow runtime or initialise a GPU. Starting
the runtime here would make a later ``cpu_replicas`` split or
``MultiWorkerMirroredStrategy`` creation in the same process fail.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfstrategy import _compat, _versions
from tfstrategy._tf import tf
from tfstrategy._versions import LEGACY_KERAS_TRUE
from tfstrategy.errors import TFStrategyError
from tfstrategy.launch.exposure import describe_tf_config_exposure, network_interfaces
from tfstrategy.multiworker.cluster import read_tf_config, validate_tf_config
from tfstrategy.multiworker.slurm import cluster_from_slurm_step, read_slurm_step
from tfstrategy.selection.choose import choose
from tfstrategy.selection.host import HostInfo
from tfstrategy.selection.select import resolve_request
from tfstrategy.settings import StrategyKind

__all__ = ["EnvReport", "collect_env_report", "format_env_report", "env_report_as_dict"]

#: Slurm variables shown in the text report; ``--json`` carries every ``SLURM_*``.
SLURM_SHOWN = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_RESV_PORTS",
    "SLURM_DISTRIBUTION",
    "SLURM_RESTART_COUNT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
)

STRATEGY_CLASSES = {
    StrategyKind.MIRRORED: "MirroredStrategy",
    StrategyKind.ONE_DEVICE: "OneDeviceStrategy",
    StrategyKind.DEFAULT: "the default strategy (no distribution)",
    StrategyKind.MULTI_WORKER: "MultiWorkerMirroredStrategy",
    StrategyKind.TPU: "TPUStrategy",
}


@dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """One physical GPU as TensorFlow reports it, without initialising it."""

    name: str
    model: str | None = None
    compute_capability: str | None = None
    visible: bool = True
    memory_limits_mb: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    """Devices of this process; tests build it by hand for GPUs that cannot exist here."""

    physical: tuple[str, ...] = ("CPU:0",)
    logical: tuple[str, ...] = ("/cpu:0",)
    gpus: tuple[GPUInfo, ...] = ()
    runtime_started: bool = False
    #: ``nvidia-smi`` rows (index, name, memory), or ``None`` when it is not installed.
    nvidia_smi: tuple[dict[str, str], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class TFConfigInfo:
    """``TF_CONFIG`` as read and checked by :mod:`tfstrategy.multiworker.cluster`."""

    raw: str | None = None
    config: dict[str, Any] | None = None
    tasks: int = 0
    error: str | None = None

    def summary(self) -> str:
        if self.raw is None:
            return "unset"
        if self.config is None:
            return "invalid (see the Problem line)" if self.error is not None else "set but empty (ignored)"
        # An invalid config may have any shape: describe only what has the expected one.
        cluster = self.config.get("cluster")
        cluster = cluster if isinstance(cluster, dict) else {}
        roles = ", ".join(
            f"{role} x{len(addresses) if isinstance(addresses, list) else '?'}" for role, addresses in cluster.items()
        ) or "no cluster"
        task = self.config.get("task")
        this = f"{task.get('type')} {task.get('index')}" if isinstance(task, dict) and task else "not given"
        if self.error is not None:
            return f"{roles}; this task: {this}; invalid (see the Problem line)"
        return f"{roles}; this task: {this}; {self.tasks} training task(s)"


@dataclass(frozen=True, kw_only=True)
class SelectionPreview:
    """What ``tfstrategy.select()`` would build here, decided without building it."""

    kind: str | None = None
    strategy: str | None = None
    devices: tuple[str, ...] = ()
    replicas: int = 0
    reasons: tuple[str, ...] = ()
    error: str | None = None

    def summary(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        devices = f" on {','.join(self.devices)}" if self.devices else ""
        plural = "s" if self.replicas != 1 else ""
        return f"{self.strategy}{devices}, {self.replicas} replica{plural} in sync ({'; '.join(self.reasons)})"


@dataclass(frozen=True, kw_only=True)
class EnvReport:
    """Everything ``tfstrategy env`` prints, as plain values."""

    tfstrategy: str
    tensorflow: str
    keras: str
    python: str
    platform: str
    cpu_cores: int | None
    usable_cores: int | None
    tf_build: dict[str, Any]
    devices: DeviceFacts
    cuda_visible_devices: str | None
    settings_env: dict[str, str]
    slurm: dict[str, str]
    #: The Slurm job step this process is a task of, and the cluster select() would build from it.
    slurm_step: str
    tf_config: TFConfigInfo
    selection: SelectionPreview
    #: What select() would do about each Keras workaround (see preview_patches).
    patches: tuple[str, ...] = field(default_factory=tuple)
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: The process-wide steps of select() and of the run/launch hook here, from the one plan (tfstrategy.plan).
    select_steps: tuple[str, ...] = field(default_factory=tuple)
    hook_steps: tuple[str, ...] = field(default_factory=tuple)
    #: Where this task's TensorFlow server will listen, and who can reach it.
    tensorflow_server: str = "none (no TF_CONFIG task)"
    #: Whether tfstrategy's accessors of private TF/Keras names resolve here (tfstrategy._compat).
    private_access: str = ""
    #: Accessor -> its state, with ``compat=True`` only.
    accessors: dict[str, str] = field(default_factory=dict)


def keras_flavour(env: Mapping[str, str]) -> tuple[str, str | None]:
    """Which Keras ``tf.keras`` resolves to, as TensorFlow decides it, plus a problem if any.

    Reads package metadata only: importing Keras would cost seconds.
    """
    legacy = env.get("TF_USE_LEGACY_KERAS")
    if legacy in LEGACY_KERAS_TRUE:
        version = _package_version("tf_keras")
        if version is None:
            return (
                f"none: TF_USE_LEGACY_KERAS={legacy} asks for tf_keras, which is not installed",
                f"TF_USE_LEGACY_KERAS={legacy} but tf_keras is not installed, so tf.keras cannot load. "
                "Run pip install tf_keras, or unset TF_USE_LEGACY_KERAS to use Keras 3.",
            )
        return f"tf_keras {version} (legacy Keras 2, TF_USE_LEGACY_KERAS={legacy})", None
    version = _package_version("keras")
    problem = None
    if legacy is not None:
        problem = (
            f"TF_USE_LEGACY_KERAS={legacy!r} is ignored: TensorFlow only accepts {', '.join(LEGACY_KERAS_TRUE)}. "
            "Set TF_USE_LEGACY_KERAS=1 for tf_keras, or unset it for Keras 3."
        )
    if version is None:
        return "none: keras is not installed", "keras is not installed, so tf.keras cannot load. Run pip install keras."
    flavour = "Keras 3" if version.startswith("3.") else f"Keras {version.split('.')[0]}"
    legacy_text = "TF_USE_LEGACY_KERAS unset" if legacy is None else f"TF_USE_LEGACY_KERAS={legacy!r} is ignored"
    return f"{version} ({flavour}, {legacy_text})", problem


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _short(device: Any) -> str:
    # PhysicalDevice(name='/physical_device:GPU:0', ...) -> "GPU:0"
    return device.name.rsplit("physical_device:", 1)[-1]


def read_device_facts() -> DeviceFacts:
    """Read devices without starting the runtime or initialising a GPU."""
    config = tf().config
    started = _compat.runtime_started()
    physical = config.list_physical_devices()
    visible = {device.name for device in config.get_visible_devices()}
    if started:
        # Once started, the runtime's own list is exact and reading it costs nothing.
        logical = tuple(
            f"/{d.device_type.lower()}:{d.name.rsplit(':', 1)[-1]}"
            for d in config.list_logical_devices()
            if d.device_type in ("CPU", "GPU", "TPU")
        )
    else:
        names: list[str] = []
        for kind in ("CPU", "GPU", "TPU"):
            visible_of_kind = config.get_visible_devices(kind)
            count = sum(len(config.get_logical_device_configuration(d) or [d]) for d in visible_of_kind)
            names += [f"/{kind.lower()}:{i}" for i in range(count)]
        logical = tuple(names)
    gpus = []
    for device in physical:
        if device.device_type != "GPU":
            continue
        details = config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        logical_configs = config.get_logical_device_configuration(device) or []
        limits = tuple(int(c.memory_limit) for c in logical_configs if c.memory_limit is not None)
        gpus.append(
            GPUInfo(
                name=_short(device),
                model=details.get("device_name"),
                compute_capability=".".join(str(part) for part in capability) if capability else None,
                visible=device.name in visible,
                memory_limits_mb=limits,
            )
        )
    return DeviceFacts(
        physical=tuple(_short(d) for d in physical),
        logical=logical,
        gpus=tuple(gpus),
        runtime_started=started,
        nvidia_smi=read_nvidia_smi(),
    )


def read_nvidia_smi(timeout: float = 10.0) -> tuple[dict[str, str], ...] | None:
    """GPU names and total memory from ``nvidia-smi`` (a separate process: our GPUs stay untouched)."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        result = subprocess.run(
            [executable, "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return ({"error": f"nvidia-smi failed: {error}"},)
    if result.returncode != 0:
        return ({"error": f"nvidia-smi exited {result.returncode}: {result.stderr.strip()[:200]}"},)
    return parse_nvidia_smi(result.stdout)


def parse_nvidia_smi(output: str) -> tuple[dict[str, str], ...]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`` lines."""
    rows = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3:
            rows.append({"index": parts[0], "name": parts[1], "memory": parts[2]})
    return tuple(rows)


def read_tf_config_info(env: Mapping[str, str]) -> TFConfigInfo:
    """Read and validate ``TF_CONFIG`` as ``select()`` does; a bad value becomes the error text.

    The error is the exact message ``select()`` would raise (``load_cluster_config``
    parses and then validates: JSON, roles, addresses, task type and index). A
    value that parses but fails validation keeps its parsed ``config`` for ``--json``.
    """
    raw = env.get("TF_CONFIG")
    if raw is None:
        return TFConfigInfo()
    try:
        config = read_tf_config(env)
    except TFStrategyError as error:
        return TFConfigInfo(raw=raw, error=str(error))
    if config is None:
        return TFConfigInfo(raw=raw)
    try:
        cluster = validate_tf_config(config)
    except TFStrategyError as error:
        return TFConfigInfo(raw=raw, config=config, error=str(error))
    return TFConfigInfo(raw=raw, config=config, tasks=cluster.num_workers)


def preview_selection(env: Mapping[str, str], host: HostInfo, *, can_split_cpu: bool = True) -> SelectionPreview:
    """Resolve settings like :func:`tfstrategy.select` with no arguments, and choose, without building.

    A ``cpu_replicas`` setting counts as the CPU split ``select`` would make,
    unless ``can_split_cpu`` is false (the runtime started, so ``select`` could not split).
    """
    try:
        request = resolve_request(env=env)  # what select() reads: the same checks, the same errors
        if request.cpu_replicas is not None and can_split_cpu:
            host = dataclasses.replace(host, cpus=max(host.cpus, request.cpu_replicas))
        choice = choose(
            kind=request.kind,
            devices=request.devices,
            cpu_replicas=request.cpu_replicas,
            host=host,
            cluster_tasks=request.cluster_tasks,
            cluster_source=request.cluster_source or "TF_CONFIG",
        )
    except TFStrategyError as error:
        return SelectionPreview(error=f"{type(error).__name__}: {error}")
    sources = [f"{name} from {source}" for name, source in request.sources.items()]
    tasks = request.cluster_tasks
    total = choice.replicas * tasks if choice.kind is StrategyKind.MULTI_WORKER and tasks else choice.replicas
    return SelectionPreview(
        kind=choice.kind.value,
        strategy=STRATEGY_CLASSES[choice.kind],
        devices=tuple(str(device) for device in choice.devices),
        replicas=total,
        reasons=(*choice.reasons, ", ".join(sources)),
    )


def collect_env_report(env: Mapping[str, str] | None = None, *, compat: bool = False) -> EnvReport:
    """Gather the environment report; leaves TensorFlow's runtime unstarted.

    Args:
        env: the environment to read (``os.environ`` when omitted). Devices are
            always this process's.
        compat: check every private TF/Keras name tfstrategy uses, importing the
            modules that hold them (seconds), and list each accessor; without it
            only names in modules already imported are checked.

    Example:
        >>> print(format_env_report(collect_env_report()))
        - tfstrategy: 0.1.0
        ...
    """
    from tfstrategy import __version__

    env = os.environ if env is None else env
    tf_ = tf()
    problems: list[str] = []
    keras, keras_problem = keras_flavour(env)
    if keras_problem:
        problems.append(keras_problem)
    version_problem = _versions.detect(env).problem()
    if version_problem:
        problems.append(f"select() would raise UnsupportedVersionError: {version_problem}")
    devices = read_device_facts()
    host = dataclasses.replace(HostInfo.detect(), cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
    tf_config = read_tf_config_info(env)
    selection = preview_selection(env, host, can_split_cpu=not devices.runtime_started)
    if tf_config.error:
        problems.append(f"select() would raise ClusterConfigError: {tf_config.error}")
    elif selection.error:
        problems.append(f"select() would raise {selection.error}")
    accessors = _compat.accessor_status(import_modules=compat)
    broken = [status.name for status in accessors if status.resolved is False]
    if broken:
        problems.append(f"private TF/Keras names tfstrategy uses are missing here (accessors {', '.join(broken)}); "
                        "the features using them may fail: report it with this output")
    affinity = getattr(os, "sched_getaffinity", None)
    return EnvReport(
        tfstrategy=__version__,
        tensorflow=tf_.__version__,
        keras=keras,
        python=f"{platform.python_version()} ({platform.python_implementation()})",
        platform=platform.platform(),
        cpu_cores=os.cpu_count(),
        usable_cores=len(affinity(0)) if affinity else None,
        tf_build=dict(tf_.sysconfig.get_build_info()),
        devices=devices,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        settings_env={key: shown_value(key, env[key]) for key in sorted(env) if key.startswith("TFSTRATEGY_")},
        slurm={key: env[key] for key in sorted(env) if key.startswith("SLURM_")},
        slurm_step=describe_slurm_step(env),
        tf_config=tf_config,
        selection=selection,
        patches=preview_patches(env),
        problems=tuple(problems),
        **preview_steps(env),
        tensorflow_server=describe_tf_config_exposure(tf_config.config, network_interfaces()),
        private_access=_compat.accessor_summary(accessors),
        accessors={status.name: status.state() for status in accessors} if compat else {},
    )


#: Words that mark a variable whose value the report (pasted into bug reports) never shows.
SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD")


def shown_value(key: str, value: str) -> str:
    """``value`` as the report shows it: a secret only as set and its length."""
    if any(word in key.upper() for word in SECRET_WORDS):
        return f"<set, {len(value)} characters, not shown>"
    return value


def preview_steps(env: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """The steps select() and the start-up hook would take here: the plan both of them follow."""
    from tfstrategy.launch.worker_hook import hook_plan
    from tfstrategy.selection.select import select_plan

    result: dict[str, tuple[str, ...]] = {}
    for key, make in (("select_steps", lambda: select_plan(resolve_request(env=env), env)),
                      ("hook_steps", lambda: hook_plan(env))):
        try:
            result[key] = tuple(step.name for step in make())
        except TFStrategyError as error:
            result[key] = (f"none: {type(error).__name__}: {error}",)
    return result


def describe_slurm_step(env: Mapping[str, str]) -> str:
    """The job step this process is a task of, and what select() does with it, in one line."""
    try:
        step = read_slurm_step(env)
        if step is None:
            return "not in a job step (a batch script without srun is one worker)" if env.get("SLURM_JOB_ID") else "none"
        text = step.describe()
        if env.get("TF_CONFIG", "").strip():
            return f"{text}; TF_CONFIG is set, so select() uses it instead"
        if step.num_tasks < 2:
            return f"{text}; one task, so one worker"
        cluster = cluster_from_slurm_step(env)
        if cluster is None:
            return f"{text}; TFSTRATEGY_SLURM=off, so every task is its own job"
        return f"{text}; select() sets TF_CONFIG: worker {cluster.config.task_index} of {cluster.config.num_workers} " \
            f"at {cluster.config.address}, workers {','.join(cluster.config.cluster['worker'])} (ports {cluster.port_source})"
    except TFStrategyError as error:
        return f"{type(error).__name__}: {error}"


def preview_patches(env: Mapping[str, str]) -> tuple[str, ...]:
    """What select() would do about each Keras workaround here, without installing any.

    Probes that run TensorFlow ops (they would start the runtime) are not run.
    """
    from tfstrategy.patches import PATCHES

    if _versions.legacy_keras_requested(env):
        return tuple(f"{name}: not applicable (tf_keras has no such bug)" for name in PATCHES)
    lines = []
    for name, patch in PATCHES.items():
        if patch.target_module() is None:
            lines.append(f"{name}: not applicable to this Keras")
        elif patch.probe_on_first_use:
            lines.append(f"{name}: would be installed; probes Keras when a model first needs it")
        else:
            needed = patch.needed()
            verdict = {True: "bug present, would be installed", False: "bug absent, not needed"}.get(
                needed, "probe failed, Keras left alone"
            )
            lines.append(f"{name}: {verdict}")
    return tuple(lines)


def describe_build(build: Mapping[str, Any]) -> str:
    """``CUDA build (CUDA 12.5, cuDNN 9)`` or ``CPU-only build``."""
    if build.get("is_cuda_build"):
        return f"CUDA build (CUDA {build.get('cuda_version', '?')}, cuDNN {build.get('cudnn_version', '?')})"
    if build.get("is_rocm_build"):
        return f"ROCm build (ROCm {build.get('rocm_version', '?')})"
    return "CPU-only build (no CUDA)"


def describe_gpus(devices: DeviceFacts) -> str:
    """One phrase per GPU TensorFlow sees, e.g. ``GPU:0 NVIDIA A100 (compute 8.0)``."""
    if not devices.gpus:
        return "none visible to TensorFlow"
    parts = []
    for gpu in devices.gpus:
        text = gpu.name + (f" {gpu.model}" if gpu.model else "")
        extras = [f"compute {gpu.compute_capability}"] if gpu.compute_capability else []
        if gpu.memory_limits_mb:
            extras.append("memory limit " + "+".join(f"{mb} MB" for mb in gpu.memory_limits_mb))
        if not gpu.visible:
            extras.append("hidden by set_visible_devices")
        parts.append(text + (f" ({', '.join(extras)})" if extras else ""))
    return "; ".join(parts)


def _describe_nvidia_smi(rows: tuple[dict[str, str], ...] | None) -> str:
    if rows is None:
        return "not installed"
    if not rows:
        return "no GPU listed"
    return "; ".join(row.get("error") or f"{row['index']}: {row['name']}, {row['memory']}" for row in rows)


def _mapping_line(values: Mapping[str, str], shown: tuple[str, ...] | None, empty: str) -> str:
    if not values:
        return empty
    keys = [key for key in values if shown is None or key in shown]
    # A 10 KB value is shown cut: the report is for pasting (--json keeps it whole).
    text = ", ".join(f"{key}={values[key] if len(values[key]) <= 200 else values[key][:200] + '...'}" for key in keys)
    hidden = len(values) - len(keys)
    return text + (f" (+{hidden} more with --json)" if hidden else "")


def _selection_line(report: EnvReport) -> str:
    error = report.tf_config.error
    if error and report.selection.error and report.selection.error.endswith(error):
        # The same text is on the TF_CONFIG line; once is enough in a bug report.
        return "nothing: it would raise ClusterConfigError for TF_CONFIG (see the Problem line)"
    if report.selection.error:
        return "nothing: it would raise " + report.selection.error
    return report.selection.summary()


def env_report_lines(report: EnvReport) -> list[tuple[str, str]]:
    """The report as ``(key, value)`` pairs in print order."""
    devices = report.devices
    cores = f"{report.cpu_cores}" + (f" ({report.usable_cores} usable by this process)" if report.usable_cores else "")
    state = "started" if devices.runtime_started else "not started (logical devices can still be split)"
    lines = [
        ("tfstrategy", report.tfstrategy),
        ("TensorFlow", f"{report.tensorflow}, {describe_build(report.tf_build)}"),
        ("Keras", report.keras),
        ("Python", report.python),
        ("Platform", report.platform),
        ("CPU cores", cores),
        ("Physical devices", ", ".join(devices.physical) or "none"),
        ("Logical devices", ", ".join(devices.logical) or "none"),
        ("TensorFlow runtime", state),
        ("GPUs", describe_gpus(devices)),
        ("nvidia-smi", _describe_nvidia_smi(devices.nvidia_smi)),
        ("CUDA_VISIBLE_DEVICES", "unset" if report.cuda_visible_devices is None else repr(report.cuda_visible_devices)),
        ("TF_CONFIG", report.tf_config.summary()),
        ("Slurm", _mapping_line(report.slurm, SLURM_SHOWN, "not under Slurm (no SLURM_* variables)")),
        *([("Slurm job step", report.slurm_step)] if report.slurm else []),
        ("TFSTRATEGY_* variables", _mapping_line(report.settings_env, None, "none")),
        ("TensorFlow server", report.tensorflow_server),
        ("select() would choose", _selection_line(report)),
        ("Keras patches", "; ".join(report.patches) or "none"),
        ("select() steps", ", ".join(report.select_steps) or "none"),
        ("run/launch hook steps", ", ".join(report.hook_steps) or "none"),
        ("Private TF/Keras access", report.private_access or "not checked"),
        *((f"accessor {name}", state) for name, state in report.accessors.items()),
    ]
    lines += [("Problem", problem) for problem in report.problems]
    return lines


def format_env_report(report: EnvReport) -> str:
    """Copy-pasteable ``- key: value`` lines, for bug reports."""
    return "\n".join(f"- {key}: {value}" for key, value in env_report_lines(report))


def env_report_as_dict(report: EnvReport) -> dict[str, Any]:
    """A JSON-ready dict with every field, including the parsed TF_CONFIG and all Slurm variables."""
    result = dataclasses.asdict(report)
    result["tf_config"]["summary"] = report.tf_config.summary()
    result["selection"]["summary"] = report.selection.summary()
    result["problems"] = list(report.problems)
    return result
