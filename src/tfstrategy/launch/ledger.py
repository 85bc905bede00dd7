"""Moved to :mod:`tfstrategy.contract.ledger` (both sides of the ledger file); these names stay importable here."""

from tfstrategy.contract.ledger import FunctionTrace as FunctionTrace
from tfstrategy.contract.ledger import Ledger as Ledger
from tfstrategy.contract.ledger import ledger_path as ledger_path
from tfstrategy.contract.ledger import read_ledger as read_ledger
from tfstrategy.contract.ledger import write_ledger as write_ledger

__all__ = ["Ledger", "FunctionTrace", "ledger_path", "read_ledger", "write_ledger"]
