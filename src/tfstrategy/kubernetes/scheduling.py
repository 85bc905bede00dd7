"""What the scheduler and the queues read from the Job of ``tfstrategy k8s`` (pure).

Resources: a pod without requests is BestEffort, the first evicted when a node runs short, so
the Job always asks for CPU and memory (:data:`DEFAULT_CPU`, :data:`DEFAULT_MEMORY` unless given).
Memory's limit equals its request: a worker that grows past it is OOM-killed (exit 137, a counted
retry) instead of being evicted with its whole job under node pressure. CPU has no limit unless
``--cpu-limit``: a CFS-throttled worker stalls every peer in each collective, and an idle core is
better used by a worker than left alone.

Placement and queues: ``nodeSelector``, ``tolerations``, ``imagePullSecrets``,
``serviceAccountName``, Kueue's ``kueue.x-k8s.io/queue-name`` label (with ``suspend: true``, as
Kueue's "Run A Kubernetes Job" asks: Kueue unsuspends the Job once its queue admits it), and
``ttlSecondsAfterFinished``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from tfstrategy.errors import LaunchError
from tfstrategy.kubernetes.names import label_key_problem, label_value_problem

__all__ = [
    "Toleration", "parse_toleration", "parse_node_selector", "parse_ttl", "quantity", "check_quantity",
    "resources", "TAINT_EFFECTS", "DEFAULT_CPU", "DEFAULT_MEMORY", "DEFAULT_TTL", "KUEUE_QUEUE_LABEL",
]

#: CPU and memory each pod requests unless told: enough for TensorFlow and a small model, and
#: never BestEffort. Real jobs set their own (the docs say how to measure).
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "4Gi"
#: A finished Job (and its pods, with their logs) is deleted a day later, so the name is free again.
DEFAULT_TTL = 86400
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_INT32_MAX = 2**31 - 1  # ttlSecondsAfterFinished is an int32

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {"": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
           "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
           "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
           "Ei": Decimal(2) ** 60}


@dataclass(frozen=True)
class Toleration:
    """A pod toleration: ``key=value:Effect`` tolerates that taint, ``key:Effect`` any value of ``key``."""

    key: str
    value: str | None = None
    effect: str | None = None

    def text(self) -> str:
        """The flag's form, ``KEY[=VALUE][:EFFECT]``."""
        return self.key + ("" if self.value is None else f"={self.value}") + ("" if self.effect is None else f":{self.effect}")

    def manifest(self) -> dict[str, object]:
        """The ``tolerations`` entry: operator Equal with a value, Exists without; no effect means every effect."""
        entry: dict[str, object] = {"key": self.key, "operator": "Exists" if self.value is None else "Equal"}
        if self.value is not None:
            entry["value"] = self.value
        if self.effect is not None:
            entry["effect"] = self.effect
        return entry


def quantity(text: str) -> Decimal | None:
    """The amount a Kubernetes quantity stands for (``500m`` -> 0.5, ``1Gi`` -> 1073741824), ``None`` if malformed."""
    match = _QUANTITY.match(text)
    return None if match is None else Decimal(match[1]) * _SUFFIX[match[2] or ""]


def check_quantity(flag: str, text: str, example: str) -> None:
    """Raise a one-line error unless ``text`` is a quantity (``--cpu 500m``, ``--memory 16Gi``).

    Raises:
        LaunchError: ``text`` is not a Kubernetes quantity.
    """
    if quantity(text) is None:
        hint = " (G is 10^9 bytes, Gi 2^30; 'GB' is not a Kubernetes unit)" if text.endswith("B") else ""
        raise LaunchError(f"Received {flag} {text!r}; expected a Kubernetes quantity: a number with an optional "
                          f"suffix m, k, M, G, Ki, Mi, Gi, ...{hint}, e.g. {flag} {example}.")


def parse_node_selector(items: Iterable[str]) -> dict[str, str]:
    """``--node-selector KEY=VALUE`` flags as a ``nodeSelector`` (every pair must match a node's labels).

    Raises:
        LaunchError: a malformed pair, an invalid label key or value, or one key given two values.
    """
    selector: dict[str, str] = {}
    example = "--node-selector cloud.google.com/gke-accelerator=nvidia-l4"
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise LaunchError(f"Received --node-selector {item!r}; expected KEY=VALUE, a label every node of the job "
                              f"must have, e.g. {example}.")
        problem = label_key_problem(key)
        if problem is not None:
            problem = f"whose key {key!r} {problem}"
        elif (value_problem := label_value_problem(value)) is not None:
            problem = f"whose value {value!r} {value_problem}"
        if problem is not None:
            raise LaunchError(f"Received --node-selector {item!r}, {problem}; expected a node label "
                              f"[prefix/]name=value (names and values: letters, digits, '-', '_', '.', at most 63 "
                              f"characters), e.g. {example}.")
        if selector.get(key, value) != value:
            raise LaunchError(f"Received --node-selector {key}={selector[key]} and {key}={value}; a node label has one "
                              "value. Keep one of them.")
        selector[key] = value
    return selector


def parse_toleration(text: str) -> Toleration:
    """``--toleration KEY[=VALUE][:EFFECT]`` as a :class:`Toleration`.

    Example:
        >>> parse_toleration("nvidia.com/gpu:NoSchedule")
        Toleration(key='nvidia.com/gpu', value=None, effect='NoSchedule')

    Raises:
        LaunchError: a malformed toleration, naming what was received and the form expected.
    """
    head, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, equals, value = head.partition("=")
    expected = ("expected KEY[=VALUE][:EFFECT] matching a node taint (kubectl describe node shows them), EFFECT one "
                "of " + ", ".join(TAINT_EFFECTS) + ", e.g. --toleration nvidia.com/gpu:NoSchedule or "
                "--toleration dedicated=ml:NoExecute")
    if colon and effect not in TAINT_EFFECTS:
        raise LaunchError(f"Received --toleration {text!r} with the effect {effect!r}; {expected}.")
    problem = label_key_problem(key)
    if problem is not None:
        problem = f"whose key {key!r} {problem}"
    elif equals and (value_problem := label_value_problem(value)) is not None:
        problem = f"whose value {value!r} {value_problem}"
    if problem is not None:
        raise LaunchError(f"Received --toleration {text!r}, {problem}; {expected}.")
    return Toleration(key, value if equals else None, effect or None)


def parse_ttl(text: str) -> int | None:
    """``--ttl-after-finished`` as seconds, or ``None`` for ``never``.

    Raises:
        LaunchError: neither a whole number of seconds, 0 or more, nor ``never``.
    """
    if text == "never":
        return None
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > _INT32_MAX:
        raise LaunchError(f"Received --ttl-after-finished {text!r}; expected the seconds Kubernetes keeps a finished "
                          f"Job and its pods (their logs) before deleting them, 0 to {_INT32_MAX}, or 'never', e.g. "
                          f"--ttl-after-finished {DEFAULT_TTL} (a day).")
    return int(text)


def resources(cpu: str | None, memory: str | None, cpu_limit: str | None, gpus: int) -> dict[str, object]:
    """The container's ``resources`` (this module's docstring says why memory has a limit and CPU not)."""
    requests: dict[str, object] = {}
    limits: dict[str, object] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if cpu_limit is not None:
        limits["cpu"] = cpu_limit
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
    if gpus:
        # An extended resource cannot be overcommitted: request and limit must be equal.
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    return {key: amounts for key, amounts in (("requests", requests), ("limits", limits)) if amounts}

