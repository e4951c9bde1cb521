"""Egress recorder, loaded by every Python process whose PYTHONPATH starts with this directory.

With VERL_GRPO_EGRESS_LOG set, an audit hook appends one JSON line per attempt to reach beyond this machine
(a connect or sendto to an address outside 127.0.0.0/8 and ::1, or a name lookup of a non-local host) to that
file, and the process appends `{pid, argv}` to `<log>.loaded` at start-up, so a test can tell the hook ran in
each of its processes. It records only: nothing is blocked.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import threading
import traceback

_LOG = os.environ.get("VERL_GRPO_EGRESS_LOG")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_ADDRESS_EVENTS = {"socket.connect", "socket.sendto", "socket.sendmsg"}
_NAME_EVENTS = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"}
_WATCHED = frozenset(_ADDRESS_EVENTS | _NAME_EVENTS)
_busy = threading.local()


def _local_host(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).split("%", 1)[0]  # an IPv6 scope id
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name that is not localhost: resolving it may ask a DNS server
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified  # connect(0.0.0.0) reaches this host


def _outward(event: str, args: tuple):
    """The address or name `event` reaches beyond this machine, or None."""
    if event in _NAME_EVENTS:
        host = args[0] if args else None
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        return None if _local_host(host) else host
    address = args[1] if len(args) > 1 else None
    if not isinstance(address, tuple):  # AF_UNIX paths, sendmsg without an address
        return None
    return None if _local_host(address[0]) else list(address[:2])


def _record(entry: dict, path: str) -> None:
    line = (json.dumps(entry, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _hook(event: str, args: tuple) -> None:
    if event not in _WATCHED or getattr(_busy, "on", False):
        return
    _busy.on = True
    try:
        target = _outward(event, args)
        if target is not None:
            stack = traceback.format_list(traceback.extract_stack(limit=12)[:-1])
            _record({"pid": os.getpid(), "argv": sys.argv, "event": event, "target": target,
                     "stack": "".join(stack)}, _LOG)
    except Exception:  # a recorder must never break the process it watches
        pass
    finally:
        _busy.on = False


if _LOG:
    sys.addaudithook(_hook)
    _record({"pid": os.getpid(), "argv": sys.argv, "orig_argv": sys.orig_argv}, _LOG + ".loaded")
