"""The environment report behind ``tfstrategy env``: where this host and process stand.

:func:`collect_env_report` gathers the facts a bug report needs (versions, the
Keras flavour, TensorFlow's build, devices, ``CUDA_VISIBLE_DEVICES``,
``TF_CONFIG``, the cluster environment, and what ``select()`` would choose) into an
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfstrategy import _compat, _versions
from tfstrategy._tf import tf
from tfstrategy._versions import LEGACY_KERAS_TRUE
from tfstrategy.diagnostics.env_devices import DeviceFacts as DeviceFacts  # re-exported: they moved there
from tfstrategy.diagnostics.env_devices import GPUInfo as GPUInfo
from tfstrategy.diagnostics.env_devices import describe_build as describe_build
from tfstrategy.diagnostics.env_devices import describe_gpus as describe_gpus
from tfstrategy.diagnostics.env_devices import describe_nvidia_smi, read_device_facts, read_nvidia_smi
from tfstrategy.diagnostics.env_devices import parse_nvidia_smi as parse_nvidia_smi
from tfstrategy.environments import ENVIRONMENTS, detect_environment, environment_type
from tfstrategy.environments.base import variables_line
from tfstrategy.errors import MissingDependencyError, TFStrategyError
from tfstrategy.launch.exposure import describe_tf_config_exposure, network_interfaces
from tfstrategy.multiworker.cluster import read_tf_config, validate_tf_config
from tfstrategy.runtime.select import resolve_request
from tfstrategy.selection.choose import choose
from tfstrategy.selection.host import HostInfo
from tfstrategy.settings import StrategyKind
from tfstrategy.state.registry import RUNTIME

__all__ = ["EnvReport", "collect_env_report", "format_env_report", "env_report_as_dict"]

STRATEGY_CLASSES = {
    StrategyKind.MIRRORED: "MirroredStrategy",
    StrategyKind.ONE_DEVICE: "OneDeviceStrategy",
    StrategyKind.DEFAULT: "the default strategy (no distribution)",
    StrategyKind.MULTI_WORKER: "MultiWorkerMirroredStrategy",
    StrategyKind.TPU: "TPUStrategy",
}


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
    #: TensorFlow's version, ``None`` when this Python cannot import it (the report is then read without it).
    tensorflow: str | None
    keras: str
    python: str
    platform: str
    cpu_cores: int | None
    usable_cores: int | None
    tf_build: dict[str, Any]
    devices: DeviceFacts
    cuda_visible_devices: str | None
    settings_env: dict[str, str]
    #: The cluster environment this process runs in (tfstrategy.environments), in one line.
    environment: str
    #: Each environment's lines about its own variables (Slurm: its variables and the job step).
    environment_lines: tuple[tuple[str, str], ...]
    #: Each environment's JSON fields (Slurm: ``slurm``, every ``SLURM_*``, and ``slurm_step``).
    environment_values: dict[str, Any]
    tf_config: TFConfigInfo
    selection: SelectionPreview
    #: What select() would do about each Keras workaround (see preview_patches).
    patches: tuple[str, ...] = field(default_factory=tuple)
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: The process-wide steps of select() and of the run/launch hook here, from the one plan (tfstrategy.runtime.plan).
    select_steps: tuple[str, ...] = field(default_factory=tuple)
    hook_steps: tuple[str, ...] = field(default_factory=tuple)
    #: Every replacement of TensorFlow's or Keras' code installed in this process (tfstrategy.runtime).
    replacements: tuple[str, ...] = field(default_factory=tuple)
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
            kind=request.kind or StrategyKind.AUTO,
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
    from tfstrategy._release import __version__

    env = os.environ if env is None else env
    problems: list[str] = []
    try:
        tf_: Any = tf()
    except MissingDependencyError as error:
        # Without TensorFlow the report still says what it can (versions, TF_CONFIG, Slurm, nvidia-smi).
        tf_ = None
        problems.append(str(error))
    keras, keras_problem = keras_flavour(env)
    if keras_problem and tf_ is not None:  # without TensorFlow, its extra installs Keras too
        problems.append(keras_problem)
    version_problem = _versions.detect(env).problem()
    if version_problem:
        problems.append(f"select() would raise UnsupportedVersionError: {version_problem}")
    tf_config = read_tf_config_info(env)
    if tf_ is None:
        devices = DeviceFacts(physical=(), logical=(), nvidia_smi=read_nvidia_smi())
        selection = SelectionPreview(error="MissingDependencyError: TensorFlow is not installed (see the Problem line)")
    else:
        devices = read_device_facts()
        host = dataclasses.replace(HostInfo.detect(), cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
        selection = preview_selection(env, host, can_split_cpu=not devices.runtime_started)
    environment_lines = [line for kind in ENVIRONMENTS for line in kind.report_lines(env)]
    if tf_config.error:
        problems.append(f"select() would raise ClusterConfigError: {tf_config.error}")
    elif selection.error and tf_ is not None:
        problems.append(f"select() would raise {selection.error}")
    compat = compat and tf_ is not None  # without TensorFlow every private name would be "missing"
    accessors = _compat.accessor_status(import_modules=compat)
    broken = [status.name for status in accessors if status.resolved is False]
    if broken:
        problems.append(f"private TF/Keras names tfstrategy uses are missing here (accessors {', '.join(broken)}); "
                        "the features using them may fail: report it with this output")
    affinity = getattr(os, "sched_getaffinity", None)
    return EnvReport(
        tfstrategy=__version__,
        tensorflow=None if tf_ is None else tf_.__version__,
        keras=keras,
        python=f"{platform.python_version()} ({platform.python_implementation()})",
        platform=platform.platform(),
        cpu_cores=os.cpu_count(),
        usable_cores=len(affinity(0)) if affinity else None,
        tf_build={} if tf_ is None else dict(tf_.sysconfig.get_build_info()),
        devices=devices,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        settings_env={key: shown_value(key, env[key]) for key in sorted(env) if key.startswith("TFSTRATEGY_")},
        environment=describe_environment(env, [("Problem", problem) for problem in problems] + environment_lines),
        environment_lines=tuple(environment_lines),
        environment_values={key: value for kind in ENVIRONMENTS for key, value in kind.report_values(env).items()},
        tf_config=tf_config,
        selection=selection,
        patches=preview_patches(env) if tf_ is not None else ("none: TensorFlow is not installed",),
        problems=tuple(problems),
        **preview_steps(env),
        tensorflow_server=describe_tf_config_exposure(tf_config.config, network_interfaces()),
        private_access=(_compat.accessor_summary(accessors) if tf_ is not None
                        else "not checked: TensorFlow is not installed"),
        accessors={status.name: status.state() for status in accessors} if compat else {},
    )


#: Words that mark a variable whose value the report (pasted into bug reports) never shows.
SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD")


def shown_value(key: str, value: str) -> str:
    """``value`` as the report shows it: a secret only as set and its length."""
    if any(word in key.upper() for word in SECRET_WORDS):
        return f"<set, {len(value)} characters, not shown>"
    return value


def preview_steps(env: Mapping[str, str]) -> dict[str, Any]:
    """The steps select() and the start-up hook would take here (the same step objects they take), and the
    replacements installed in this process."""
    from tfstrategy.runtime.inputs import HOOK, SELECT, derive_inputs
    from tfstrategy.runtime.plan import plan_steps

    result: dict[str, Any] = {"replacements": RUNTIME.lines()}
    for key, consumer in (("select_steps", SELECT), ("hook_steps", HOOK)):
        try:
            inputs = derive_inputs(consumer, env=env)
            result[key] = tuple(step.name for step in plan_steps(inputs))
        except TFStrategyError as error:
            result[key] = (f"none: {type(error).__name__}: {error}",)
    return result


def describe_environment(env: Mapping[str, str], lines: Sequence[tuple[str, str]] = ()) -> str:
    """The cluster environment this process runs in, in one line; a bad variable becomes the error text.

    An error already on one of the report's ``lines`` (a Problem line, the Slurm job step) is only referred to.
    """
    try:
        environment = detect_environment(env)
        return "none (no cluster variables: one process)" if environment is None else environment.describe()
    except TFStrategyError as error:
        kind = environment_type(env)
        name = kind.name if kind is not None else "?"
        shown = next((key for key, value in lines if value.endswith(str(error))), None)
        if shown is not None:
            return f"{name}: invalid (see the {shown} line)"
        return f"{name}: {type(error).__name__}: {error}"


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
            verdict = ("probe failed, Keras left alone" if needed is None
                       else "bug present, would be installed" if needed else "bug absent, not needed")
            lines.append(f"{name}: {verdict}")
    return tuple(lines)


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
        ("TensorFlow", "not installed (see the Problem line)" if report.tensorflow is None
         else f"{report.tensorflow}, {describe_build(report.tf_build)}"),
        ("Keras", report.keras),
        ("Python", report.python),
        ("Platform", report.platform),
        ("CPU cores", cores),
        *(() if report.tensorflow is None else (
            ("Physical devices", ", ".join(devices.physical) or "none"),
            ("Logical devices", ", ".join(devices.logical) or "none"),
            ("TensorFlow runtime", state),
            ("GPUs", describe_gpus(devices)),
        )),
        ("nvidia-smi", describe_nvidia_smi(devices.nvidia_smi)),
        ("CUDA_VISIBLE_DEVICES", "unset" if report.cuda_visible_devices is None else repr(report.cuda_visible_devices)),
        ("TF_CONFIG", report.tf_config.summary()),
        *report.environment_lines,
        ("Cluster environment", report.environment),
        ("TFSTRATEGY_* variables", variables_line(report.settings_env, None, "none")),
        ("TensorFlow server", report.tensorflow_server),
        ("select() would choose", _selection_line(report)),
        ("Keras patches", f"{len(report.patches)}, one a line" if report.patches else "none"),
        *((f"patch {name}", state) for name, _, state in (line.partition(": ") for line in report.patches)),
        ("select() steps", ", ".join(report.select_steps) or "none"),
        ("run/launch hook steps", ", ".join(report.hook_steps) or "none"),
        ("Private TF/Keras access", report.private_access or "not checked"),
        *((f"accessor {name}", state) for name, state in report.accessors.items()),
        ("Replaced in this process", "; ".join(report.replacements) or "nothing"),
    ]
    lines += [("Problem", problem) for problem in report.problems]
    return lines


def format_env_report(report: EnvReport) -> str:
    """Copy-pasteable ``- key: value`` lines, for bug reports."""
    return "\n".join(f"- {key}: {value}" for key, value in env_report_lines(report))


def env_report_as_dict(report: EnvReport) -> dict[str, Any]:
    """A JSON-ready dict with every field, including the parsed TF_CONFIG and each environment's variables."""
    result = dataclasses.asdict(report)
    del result["environment_lines"]  # the text report's; the values are in the environments' own fields
    result.update(result.pop("environment_values"))
    result["tf_config"]["summary"] = report.tf_config.summary()
    result["selection"]["summary"] = report.selection.summary()
    result["problems"] = list(report.problems)
    return result
