"""Moved to :mod:`tfstrategy.contract.reports` (a worker's error and progress files); these names stay importable here."""

from tfstrategy.contract.reports import HEARTBEAT_SECONDS as HEARTBEAT_SECONDS
from tfstrategy.contract.reports import ErrorRecord as ErrorRecord
from tfstrategy.contract.reports import Progress as Progress
from tfstrategy.contract.reports import ProgressWriter as ProgressWriter
from tfstrategy.contract.reports import read_error as read_error
from tfstrategy.contract.reports import read_progress as read_progress
from tfstrategy.contract.reports import user_frame as user_frame
from tfstrategy.contract.reports import write_error as write_error

__all__ = ["ErrorRecord", "write_error", "read_error", "Progress", "ProgressWriter", "read_progress"]
