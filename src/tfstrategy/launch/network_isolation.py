"""Keep a local job's TensorFlow servers unreachable from other machines.

TensorFlow's gRPC server listens on ``0.0.0.0:<port>`` whatever host
``TF_CONFIG`` names (the address is fixed in its C++ server; no option changes
it), so the workers of ``tfstrategy launch`` are reachable from the network
while they run. ``tfstrategy launch --isolate-network`` therefore runs the
launcher and its workers in a private network namespace (``unshare --net
--map-root-user``, no root needed where unprivileged user namespaces are
allowed) that has only a loopback interface: the servers still bind 0.0.0.0,
but that namespace's 0.0.0.0 is 127.0.0.1 alone. The price: the workers have
no network at all (read data from local files).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence

from tfstrategy.errors import PlatformError
from tfstrategy.settings import ISOLATED

__all__ = ["is_isolated", "reexec_isolated", "bring_up_loopback"]

#: Set inside the namespace, so the re-executed launcher does not isolate itself again.
UNSHARE = ("unshare", "--net", "--map-root-user")
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def is_isolated() -> bool:
    """Whether this process runs in the private namespace made by :func:`reexec_isolated`."""
    return bool(ISOLATED.read(os.environ))


def check_isolation_available() -> None:
    """Raise unless ``unshare`` can create a network namespace here.

    Raises:
        PlatformError: ``unshare`` is missing or not permitted, with the remedy.
    """
    remedy = ("Drop --isolate-network and keep the ports closed to other hosts with a firewall "
              "(see 'Network exposure' in the README).")
    if shutil.which(UNSHARE[0]) is None:
        raise PlatformError(f"Received --isolate-network, but 'unshare' (util-linux) is not installed. {remedy}")
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"status {probe.returncode}"
        raise PlatformError(
            f"Received --isolate-network, but this system does not allow a private network namespace ({said}; "
            f"unprivileged user namespaces may be disabled). {remedy}"
        )


def reexec_isolated(argv: Sequence[str]) -> None:
    """Replace this process by ``python -m tfstrategy ARGV`` inside a new network namespace (no return).

    Raises:
        PlatformError: namespaces are not available (see :func:`check_isolation_available`).
    """
    check_isolation_available()
    os.environ.update(ISOLATED.to_environ(True))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(UNSHARE[0], [*UNSHARE, "--", sys.executable, "-m", "tfstrategy", *argv])


def bring_up_loopback() -> None:
    """Set ``lo`` up: a new network namespace starts with it down, and workers talk over it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
