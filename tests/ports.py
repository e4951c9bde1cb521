"""Free loopback ports for the servers tests start, taken below the kernel's ephemeral range.

A port the kernel hands out for `bind(0)` lies in the ephemeral range, which every outgoing connection on the
machine also draws from: between the probe and the server's own bind (seconds, for a server that imports a large
library first), an HTTP client elsewhere in the suite can take it, and the server dies on "address already in
use". Ports from 20000 up to the range's start are used by neither outgoing connections nor Ray's workers
(10002–19999 by default), so only another probe of this helper can meet one, at random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the ephemeral range where one is left."""
    top = _ephemeral_start() - 1
    candidates = random.sample(range(_LOWEST, top), k=min(64, top - _LOWEST)) if top > _LOWEST else []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the ephemeral range on this machine
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
