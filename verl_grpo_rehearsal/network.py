"""A rehearsal job's own network: one network namespace that every node of the job joins.

On a cloud a job's VMs have their own network stack: Ray's head port (6379), its dashboard (8265) and the services'
ports (8000-8003) are the job's alone. The rehearsal's nodes are namespaces on one machine, so without this they
shared the machine's loopback: two rehearsals at once collided on those ports, and a node could even join another
rehearsal's Ray cluster. Each job therefore gets a network namespace (held by a small relay process) whose loopback
only its nodes use; the endpoints on this machine that the task is given by URL (the store's S3 endpoint, an MLflow
or Prefect server on 127.0.0.1) are relayed in, as a real node reaches them over the network.

The relay has two halves joined by Unix sockets in a directory both see: inside the namespace, a listener on each
relayed 127.0.0.1 port forwards every connection to `<port>.sock`; outside, the controller accepts on `<port>.sock`
and connects to the same port on this machine's loopback. Unix sockets need no privilege to cross namespaces, so
this works with unprivileged user namespaces as well as for root.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

READY_FILE = "ready"
START_TIMEOUT_S = 30.0
_LOOPBACK_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://(?:127(?:\.\d{1,3}){3}|localhost)(?::(\d{1,5}))?", re.IGNORECASE)
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_ports(values: Iterable[str]) -> list[int]:
    """Ports of this machine's loopback that URLs among `values` name (default ports of http/https included)."""
    ports: set[int] = set()
    for value in values:
        for match in _LOOPBACK_URL.finditer(str(value)):
            if match.group(1):
                ports.add(int(match.group(1)))
            else:
                ports.add(443 if match.group(0).lower().startswith("https") else 80)
    return sorted(p for p in ports if 0 < p < 65536)


def listening_on_host(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


class JobNetwork:
    """The namespace of one job and the outside half of its relay. `enter` prefixes a node's command line."""

    def __init__(self, sock_dir: Path, ports: Iterable[int]):
        self.sock_dir = Path(sock_dir)
        self.ports = sorted(set(ports))
        self.proc: subprocess.Popen | None = None
        self._listeners: list[socket.socket] = []
        self._closed = threading.Event()

    @property
    def enter(self) -> list[str]:
        assert self.proc is not None, "start() first"
        return ["nsenter", f"--target={self.proc.pid}", "--user", "--net", "--preserve-credentials", "--"]

    def start(self, preexec_fn=None) -> None:
        for port in self.ports:
            path = self.sock_dir / f"{port}.sock"
            path.unlink(missing_ok=True)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            listener.listen(64)
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener, port), daemon=True,
                             name=f"relay-out-{port}").start()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                          os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m", __name__, str(self.sock_dir),
             *map(str, self.ports)], env=env, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=preexec_fn)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.sock_dir / READY_FILE).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the job's network namespace did not come up (relay exit {self.proc.poll()})")
            time.sleep(0.02)

    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self._closed.is_set():
            try:
                inner, _ = listener.accept()
            except OSError:
                return
            try:
                outer = socket.create_connection(("127.0.0.1", port), timeout=10)
                outer.settimeout(None)
            except OSError:
                inner.close()
                continue
            _pump_both(inner, outer)

    def stop(self) -> None:
        self._closed.set()
        for listener in self._listeners:
            listener.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for port in self.ports:
            (self.sock_dir / f"{port}.sock").unlink(missing_ok=True)


def _pump_both(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both sides are done, then close both."""
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()

    def forward() -> None:
        _pump(a, b)
        back.join()
        a.close()
        b.close()

    threading.Thread(target=forward, daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)  # the peer sees EOF, as if it were connected directly
    except OSError:
        pass


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _serve_inside(sock_dir: Path, ports: list[int]) -> None:
    """The inside half (PID of the namespace's holder): loopback up, a listener per relayed port, then serve."""
    _loopback_up()
    for port in ports:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        threading.Thread(target=_accept_inside, args=(listener, sock_dir / f"{port}.sock"), daemon=True).start()
    (sock_dir / READY_FILE).write_text(str(os.getpid()))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def _accept_inside(listener: socket.socket, path: Path) -> None:
    while True:
        inner, _ = listener.accept()
        try:
            outer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            outer.connect(str(path))
        except OSError:
            inner.close()
            continue
        _pump_both(inner, outer)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    _serve_inside(Path(sys.argv[1]), [int(p) for p in sys.argv[2:]])
