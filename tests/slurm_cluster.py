"""A private, single-node Slurm cluster for tests and CI.

``SlurmCluster`` writes a ``slurm.conf`` into a fresh temporary directory, runs
``slurmctld`` and ``slurmd`` in the foreground (``-D``) as child processes of
this Python process, and tears both down again, together with every job step
they started. Nothing under ``/etc`` is read or changed: clients find the
cluster through ``SLURM_CONF``, which is set in :attr:`SlurmCluster.env`.

Written against Debian 12's ``slurm-wlm`` 22.05.8 (install with
``.ci/install-slurm``). What the configuration relies on:

* ``AuthType=auth/none`` and ``CredType=cred/none``: no munge daemon or key.
  Both plugins ship with 22.05; newer Slurm releases dropped ``auth/none``
  (they would need munge or ``auth/slurm``).
* Everything listens on 127.0.0.1 only: ``NodeAddr=127.0.0.1``,
  ``SlurmctldHost=<hostname>(127.0.0.1)`` and
  ``CommunicationParameters=NoInAddrAny``; the two daemon ports are picked free.
* ``OverSubscribe=FORCE:4``: concurrent jobs share the node's CPUs, so two
  ``srun -n 2`` run at once on two cores. A single step with more tasks than
  CPUs needs ``srun --overcommit`` (``-O``), or build the cluster with
  ``cpus=4`` (the node then claims more CPUs than it has, through
  ``SlurmdParameters=config_overrides``).
* ``JobCompType=jobcomp/filetxt``: without slurmdbd ``sacct`` has nothing, so
  the final state and exit code of a job are read from the job-completion
  file (see :meth:`SlurmCluster.job_records`). A requeue also writes a record
  there (with ``JobState=PENDING``); the last record of a job is its outcome.
* ``JobRequeue=1`` and ``AuthInfo=cred_expire=5``: a requeued batch job may
  start again ``cred_expire + 1`` seconds after the requeue (default 120 s);
  ``SchedulerParameters=sched_interval=1,bf_interval=1`` then starts it within
  about a second instead of the next 60 s scheduling pass.
* ``MpiParams=ports=...``: every job step gets ``SLURM_STEP_RESV_PORTS``, a
  range of ports no other step on the node holds at the same time (tasks on the
  node + 1 ports by default, ``srun --resv-ports=N`` for N).

The daemons run as the current user (root in CI). Must be root: slurmd starts
job steps as the submitting user.

Example::

    with SlurmCluster() as cluster:
        result = cluster.srun(["-n", "2", "hostname"])
        job_id = cluster.sbatch("job.sh")
        record = cluster.wait_job(job_id, timeout=60)
        assert record.state == "COMPLETED"

This module only needs the standard library, so it imports without pytest.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["JobRecord", "SlurmCluster", "SlurmClusterError", "SlurmNotInstalledError"]

#: Held while a cluster runs, so that two pytest workers never run two clusters at once.
MACHINE_LOCK = os.path.join(tempfile.gettempdir(), "tfstrategy-tests-slurm.lock")

#: Job states after which a job does not run again (``squeue``'s long names).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

_DAEMONS = ("slurmctld", "slurmd")
_CLIENTS = ("srun", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
_SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_INSTALL_HINT = "Install it with `sudo .ci/install-slurm` (Debian/Ubuntu: apt-get install slurm-wlm)."


class SlurmClusterError(RuntimeError):
    """The cluster did not start, stop or answer as expected."""


class SlurmNotInstalledError(SlurmClusterError):
    """A Slurm daemon or client program is not installed."""


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """One line of the jobcomp/filetxt file: how one run of a job ended.

    ``exit_code`` and ``signal`` come from ``ExitCode=<exit>:<signal>`` (the
    batch script's, for a batch job). ``fields`` holds every key of the line.
    """

    job_id: int
    state: str
    exit_code: int
    signal: int
    fields: Mapping[str, str]


def _find_program(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN_DIRS))
    if path is None:
        raise SlurmNotInstalledError(
            f"Slurm program {name!r} not found on PATH or in {', '.join(_SBIN_DIRS)}. {_INSTALL_HINT}"
        )
    return path


def _free_ports(count: int) -> list[int]:
    """Ports that are free on 127.0.0.1 right now (held open together, so distinct)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _free_port_block(size: int, low: int = 20000, high: int = 30000) -> str:
    """A ``first-last`` range of ``size`` ports, all free on 127.0.0.1 right now."""
    rng = random.Random()
    for _ in range(50):
        first = rng.randrange(low, high - size)
        if all(_port_free(port) for port in range(first, first + size)):
            return f"{first}-{first + size - 1}"
    raise SlurmClusterError(f"Found no {size} free consecutive ports in {low}-{high - 1} for MpiParams=ports.")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|\s*$)")


def parse_jobcomp_line(line: str) -> JobRecord:
    """Parse one jobcomp/filetxt line (``Key=value Key=value ...``)."""
    fields = dict(_FIELD.findall(line.strip()))
    exit_code, _, signal_number = fields.get("ExitCode", "0:0").partition(":")
    return JobRecord(
        job_id=int(fields["JobId"]),
        state=fields.get("JobState", ""),
        exit_code=int(exit_code or 0),
        signal=int(signal_number or 0),
        fields=fields,
    )


def _processes_with_env(name: str, value: str) -> list[int]:
    """Pids of processes whose environment has ``name=value`` (Linux /proc)."""
    needle = f"{name}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry))
    return pids


class SlurmCluster:
    """A single-node Slurm cluster on 127.0.0.1, private to this process.

    Args:
        cpus: CPUs the node offers; default ``os.cpu_count()``. More than the
            machine has is allowed (``SlurmdParameters=config_overrides``).
        real_memory_mb: the node's ``RealMemory``; memory is not scheduled.
        resv_ports: ``MpiParams=ports=`` range, e.g. ``"20000-20100"``; ``"auto"``
            (default) picks a random block of 101 ports in 20000-29999 that are
            free now, so two clusters on one host are unlikely to hand out the
            same ports; None: no reserved ports.
        extra_config: more ``slurm.conf`` lines, appended (later lines win).
        base_dir: parent of the temporary directory; keep it short, slurmd's
            Unix sockets live below it (limit ~100 characters).
        keep_dir: leave the temporary directory (config, logs) after stop().

    Attributes (valid after start()):
        dir: the temporary directory; ``slurm.conf``, ``*.log`` and
            ``jobcomp.txt`` are in it.
        conf: path of ``slurm.conf``.
        env: environment for Slurm clients: this process's environment without
            any ``SLURM_*`` variables, plus ``SLURM_CONF``.
        node: the node's name (this host's short hostname).
        partition: the (default) partition's name.
        startup_seconds: how long start() took.
    """

    partition = "debug"

    def __init__(
        self,
        *,
        cpus: int | None = None,
        real_memory_mb: int = 1024,
        resv_ports: str | None = "auto",
        extra_config: Iterable[str] = (),
        base_dir: str | None = None,
        keep_dir: bool = False,
    ) -> None:
        self.cpus = cpus or os.cpu_count() or 1
        self.real_memory_mb = real_memory_mb
        self.resv_ports = resv_ports
        self.extra_config = list(extra_config)
        self.base_dir = base_dir
        self.keep_dir = keep_dir
        self.node = socket.gethostname().split(".")[0]
        self.dir: Path | None = None
        self.conf: Path | None = None
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._programs: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def config_text(self, ctld_port: int, slurmd_port: int) -> str:
        """The slurm.conf this cluster runs with (``self.dir`` must be set)."""
        d = self.dir
        user = _current_user()
        lines = [
            "# Written by tests/slurm_cluster.py: a private single-node cluster on 127.0.0.1.",
            "ClusterName=tfstest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "AuthInfo=cred_expire=5",
            "CommunicationParameters=NoInAddrAny",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={d}/jobcomp.txt",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobRequeue=1",
            "ReturnToService=2",
            "KillWait=10",
            "MailProg=/bin/true",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd.log",
            f"PlugStackConfig={d}/plugstack.conf",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        if self.resv_ports:
            lines.append(f"MpiParams=ports={self.resv_ports}")
        if self.cpus > (os.cpu_count() or 1):
            lines.append("SlurmdParameters=config_overrides")
        lines += [
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.real_memory_mb} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP"
            " OverSubscribe=FORCE:4",
        ]
        return "\n".join(lines + self.extra_config) + "\n"

    def start(self, timeout: float = 60) -> SlurmCluster:
        """Write the config, start slurmctld and slurmd, wait until the node is idle.

        Raises:
            SlurmNotInstalledError: Slurm is not installed (tests must fail, not skip).
            SlurmClusterError: not root, or the node did not become idle in ``timeout``
                seconds (the message has the tail of both logs).
        """
        if self._procs:
            raise SlurmClusterError("This SlurmCluster is already started.")
        self._programs = {name: _find_program(name) for name in _DAEMONS + _CLIENTS}
        if os.geteuid() != 0:
            raise SlurmClusterError(
                f"Received uid {os.geteuid()}; SlurmCluster needs root "
                "(slurmd starts job steps as the submitting user). "
                "Run the tests as root, e.g. in the CI container."
            )
        self._hold_the_machine()
        began = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-", dir=self.base_dir))
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        (self.dir / "plugstack.conf").write_text("")
        ctld_port, slurmd_port = _free_ports(2)
        if self.resv_ports == "auto":
            self.resv_ports = _free_port_block(101)
        self.conf = self.dir / "slurm.conf"
        self.conf.write_text(self.config_text(ctld_port, slurmd_port))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        self.env["SLURM_CONF"] = str(self.conf)
        try:
            # -D: stay in the foreground, -c: clear any saved state.
            self._spawn("slurmctld", "-D", "-c")
            self._spawn("slurmd", "-D")
            self._wait_idle(began + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _hold_the_machine(self) -> None:
        """Wait until no other cluster of these tests runs (two pytest workers): one slurmd per node name."""
        self._machine_lock = open(MACHINE_LOCK, "a")  # noqa: SIM115 - held until stop()
        fcntl.flock(self._machine_lock, fcntl.LOCK_EX)

    def _release_the_machine(self) -> None:
        lock, self._machine_lock = getattr(self, "_machine_lock", None), None
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.dir / f"{name}.out", "wb")
        with log:
            self._procs[name] = subprocess.Popen(
                [self._programs[name], *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal signals from the test runner
            )

    def _wait_idle(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise SlurmClusterError(
                        f"{name} exited with status {proc.returncode} during start-up.\n{self.log_tail()}"
                    )
            result = self.run(["sinfo", "-h", "-o", "%T"], check=False, timeout=10)
            state = result.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise SlurmClusterError(f"Node state is {state!r}, not 'idle', after start-up timeout.\n{self.log_tail()}")

    def stop(self, timeout: float = 30) -> None:
        """Cancel all jobs, stop both daemons and kill every process they left.

        Job steps (slurmstepd and the tasks) outlive slurmd by design, so after the
        daemons are gone every process whose environment has our ``SLURM_CONF`` is
        killed. Raises SlurmClusterError if any of them survives.
        """
        if not self._procs and self.dir is None:
            return
        if self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
            user = _current_user()
            # KILL first, so that jobs trapping TERM do not hold the teardown for KillWait.
            self.run(["scancel", "--full", "--signal=KILL", "--state=RUNNING", "--user", user], check=False, timeout=10)
            self.run(["scancel", "--user", user], check=False, timeout=10)
            deadline = time.monotonic() + min(timeout, 15)
            while time.monotonic() < deadline:
                queue = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                if queue.returncode == 0 and not queue.stdout.strip():
                    break
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld"):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        leftovers = self._kill_leftovers()
        if self.dir is not None and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._release_the_machine()
        if leftovers:
            raise SlurmClusterError(f"Processes of this cluster survived SIGKILL: {leftovers}")

    def _kill_leftovers(self) -> list[int]:
        if self.conf is None:
            return []
        pids = _processes_with_env("SLURM_CONF", str(self.conf))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.05)
        return pids

    def processes(self) -> list[int]:
        """Pids of every live process of this cluster: daemons, slurmstepd, tasks, clients."""
        if self.conf is None:
            return []
        return [pid for pid in _processes_with_env("SLURM_CONF", str(self.conf)) if _alive(pid)]

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the daemons' logs, for error messages."""
        out = []
        for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            path = self.dir / name if self.dir else None
            if path and path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(out)

    # ------------------------------------------------------------------ clients

    def run(
        self, argv: Sequence[str], *, timeout: float = 60, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client (``argv[0]`` is e.g. ``"scontrol"``) against this cluster.

        On timeout the client gets SIGTERM first (srun then cancels its step), then SIGKILL.
        """
        argv = [self._programs.get(argv[0], argv[0]), *argv[1:]]
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                stdout, stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr) from None
        result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        if check and result.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(argv)} exited with status {result.returncode}.\nstdout:\n{stdout}\nstderr:\n{stderr}"
            )
        return result

    def srun(self, args: Sequence[str], timeout: float = 60, *, check: bool = False) -> subprocess.CompletedProcess:
        """``srun *args``; returns the CompletedProcess (stdout/stderr as text)."""
        return self.run(["srun", *args], timeout=timeout, check=check)

    def sbatch(self, script_path: str | os.PathLike, *args: str) -> int:
        """Submit ``script_path`` (extra sbatch options in ``args``); returns the job id.

        Output goes to ``<dir>/slurm-<job id>.out`` unless ``args`` has ``-o``/``--output``.
        """
        if not any(arg == "-o" or arg.startswith(("-o", "--output")) for arg in args):
            args = (f"--output={self.dir}/slurm-%j.out", *args)
        result = self.run(["sbatch", "--parsable", *args, str(script_path)], timeout=30)
        return int(result.stdout.strip().split(";")[0])

    def scontrol(self, *args: str, check: bool = True) -> str:
        return self.run(["scontrol", *args], timeout=30, check=check).stdout

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: the job runs again (as SLURM_RESTART_COUNT+1) ~cred_expire s later."""
        self.scontrol("requeue", str(job_id))

    def cancel(self, job_id: int, *, signal_name: str | None = None, batch: bool = False, full: bool = False) -> None:
        """``scancel``. ``signal_name`` only signals: the steps by default, the batch
        shell with ``batch=True``, the batch shell and all steps (srun too) with ``full=True``."""
        args = ["scancel"]
        if signal_name:
            args.append(f"--signal={signal_name}")
        if batch:
            args.append("--batch")
        if full:
            args.append("--full")
        self.run([*args, str(job_id)], timeout=30)

    def job_info(self, job_id: int) -> dict[str, str] | None:
        """``scontrol show job -o`` as a dict, or None once the job is gone (MinJobAge)."""
        result = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=30, check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return None
        return dict(_FIELD.findall(result.stdout.strip()))

    def job_state(self, job_id: int) -> str | None:
        info = self.job_info(job_id)
        return info.get("JobState") if info else None

    def job_records(self, job_id: int | None = None) -> list[JobRecord]:
        """Records of the jobcomp file, oldest first (only ``job_id``'s if given)."""
        path = self.dir / "jobcomp.txt"
        if not path.exists():
            return []
        records = [parse_jobcomp_line(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in records if job_id is None or r.job_id == job_id]

    def wait_state(
        self, job_id: int, states: Iterable[str], timeout: float = 60, *, restarts: int | None = None
    ) -> dict[str, str]:
        """Poll ``scontrol show job`` until JobState is one of ``states`` (and, if
        given, ``Restarts`` equals ``restarts``); returns the job info."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        info = None
        while time.monotonic() < deadline:
            info = self.job_info(job_id)
            restarts_ok = info is not None and (restarts is None or int(info.get("Restarts", -1)) == restarts)
            if info and info.get("JobState") in wanted and restarts_ok:
                return info
            time.sleep(0.2)
        raise SlurmClusterError(
            f"Job {job_id} did not reach {sorted(wanted)} (restarts={restarts}) in {timeout} s; last: {info}"
        )

    def wait_job(self, job_id: int, timeout: float = 60) -> JobRecord:
        """Wait until the job has ended for good; returns its last jobcomp record.

        Polls ``scontrol show job`` while the job exists; a terminal state there
        (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) is confirmed by the jobcomp
        record written when the job ended. A requeue's PENDING record is skipped.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            records = self.job_records(job_id)
            if records and records[-1].state in TERMINAL_STATES and (state is None or state in TERMINAL_STATES):
                return records[-1]
            time.sleep(0.2)
        raise SlurmClusterError(
            f"Job {job_id} did not finish in {timeout} s; state {self.job_state(job_id)!r}, "
            f"records {self.job_records(job_id)}"
        )


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
