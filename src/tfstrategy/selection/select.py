"""Moved to :mod:`tfstrategy.runtime.select` (``select()`` takes the plan's steps, so it stands with the plans,
above what it chooses and builds with); these names resolve with a DeprecationWarning until 0.4."""

from __future__ import annotations

from tfstrategy._moved import moved_names

__getattr__ = moved_names(__name__, "tfstrategy.runtime.select", ("Request", "Selection", "resolve_request", "select"))
