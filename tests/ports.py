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


SKY_DEFAULT_API_PORT = 46580
SKY_DEFAULT_QUEUE_PORT = 50011


def sky_queue_port(api_port: int) -> int:
    """The port of the request-queue manager a SkyPilot local API server on `api_port` starts: SkyPilot derives it
    from the API port into 50000–59999 (`sky/server/requests/queues/mp_queue.py`, get_queue_manager_port), which lies
    in the ephemeral range, so it must be checked free too."""
    offset = api_port - SKY_DEFAULT_API_PORT
    return SKY_DEFAULT_QUEUE_PORT if offset == 0 else 50000 + (SKY_DEFAULT_QUEUE_PORT - 50000 + offset) % 10000


def free_sky_api_port() -> int:
    """A port for a SkyPilot local API server (SKYPILOT_API_SERVER_LOCAL_PORT) whose queue manager's port is free
    as well."""
    for _ in range(64):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", sky_queue_port(port)))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a SkyPilot API server and its queue manager")
