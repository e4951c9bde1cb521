"""The test servers' ports: outside the ephemeral range, and for a SkyPilot API server its queue manager's too."""

from __future__ import annotations

import socket

from ports import _ephemeral_start, free_port, free_sky_api_port, sky_queue_port


def test_free_ports_lie_below_the_ephemeral_range_and_are_bindable():
    for _ in range(20):
        port = free_port()
        assert 20000 <= port < _ephemeral_start()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_queue_port_is_the_one_skypilot_derives(monkeypatch):
    from sky.server.requests.queues import mp_queue

    for port in (46580, 20000, 31234, 32767, free_sky_api_port()):
        monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", str(port))
        assert mp_queue.get_queue_manager_port() == sky_queue_port(port)
