"""``python netns_run.py SCRIPT ARGS...``: run SCRIPT as ``__main__``, after bringing ``lo`` up when asked.

A new network namespace (``unshare --net``, which the Ray tests use) starts with its loopback
interface down; ``TFSTRATEGY_TEST_NETNS=1`` says the caller made one.
"""

from __future__ import annotations

import os
import runpy
import sys

if __name__ == "__main__":
    if os.environ.get("TFSTRATEGY_TEST_NETNS") == "1":
        from tfstrategy.launch.network_isolation import bring_up_loopback

        bring_up_loopback()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")
