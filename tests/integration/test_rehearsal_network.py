"""A rehearsal job's network namespace: its loopback ports are its own (two jobs bind Ray's 6379 at once, and neither
sees the other's), and the endpoints on this machine its tasks name by URL are relayed in."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from verl_grpo_rehearsal.network import JobNetwork, loopback_ports

NODE = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork"]  # as the controller starts a node


def test_loopback_ports_are_the_ports_of_loopback_urls_only():
    values = ["http://127.0.0.1:9000/store", "s3://bucket/x", "http://localhost", "https://127.0.0.1", "sqlite:///x.db",
              "--endpoint http://reward-server-0.grp:8001", "http://10.0.0.1:7000", "HTTP://LOCALHOST:5000/api"]
    assert loopback_ports(values) == [80, 443, 5000, 9000]


@pytest.fixture
def host_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_two_jobs_bind_the_same_port_and_reach_the_host_through_the_relay(host_server):
    nets = [JobNetwork(Path(tempfile.mkdtemp(prefix="verl-grpo-net-test-")), [host_server]) for _ in range(2)]
    code = ("import socket, urllib.request\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 6379)); s.listen()\n"
            f"print(urllib.request.urlopen('http://127.0.0.1:{host_server}/').status)\n")
    try:
        for net in nets:
            net.start()
        with socket_bound(6379):
            done = [subprocess.run([*net.enter, *NODE, sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=60) for net in nets]
    finally:
        for net in nets:
            net.stop()
    assert [(d.returncode, d.stdout.strip()) for d in done] == [(0, "200"), (0, "200")], [d.stderr for d in done]
    assert not any(net.proc.poll() is None for net in nets)


@contextmanager
def socket_bound(port: int):
    """This machine's own `port` held (unless something here holds it already): the jobs must not see it."""
    with socket.socket() as sock:
        with suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield
