"""Read the multi-worker cluster description (``TF_CONFIG``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from tfstrategy.errors import ClusterConfigError

EXAMPLE_TF_CONFIG = (
    '{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}'
)


def read_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Parse ``TF_CONFIG`` from the environment; ``None`` when it is unset or empty.

    Raises:
        ClusterConfigError: it is not a JSON object.
    """
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ClusterConfigError(
            f"Received TF_CONFIG={raw[:80]!r}, which is not valid JSON ({error.msg} at character {error.pos}). "
            f"Expected for example {EXAMPLE_TF_CONFIG}."
        ) from error
    if not isinstance(config, dict):
        raise ClusterConfigError(f"Received TF_CONFIG={raw[:80]!r}; expected a JSON object such as {EXAMPLE_TF_CONFIG}.")
    return config


def count_cluster_tasks(config: Mapping[str, Any] | None) -> int:
    """How many training tasks (chief and workers) the cluster has; 0 without a config."""
    if not config:
        return 0
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise ClusterConfigError(f"Received TF_CONFIG cluster={cluster!r}; expected an object such as {EXAMPLE_TF_CONFIG}.")
    return sum(len(cluster.get(role) or []) for role in ("chief", "worker"))
