"""Helpers of the fault-injection suite: a tiny TRL run, a worker process with a line watcher, a TCP proxy.

The proxy sits between the worker and the moto S3 server: it can go down and come back on the same port
(bucket state is kept by the server behind it), throttle uploads, and report how many upload bytes passed,
so a test can kill the worker at a random point inside an upload.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ports import free_port
from tiny_data import write_gsm8k_split

from verl_grpo.config import load_config
from verl_grpo.contracts import Cluster, TrainSpec
from verl_grpo.store import Store
from verl_grpo.trainers import get_trainer

RUN_ID = "faults"
N_PROMPTS = 8  # 4 steps per epoch at 2 prompts a step: 6 steps cross an epoch boundary
TINY_TRAIN = [
    "algorithm.train_batch_size=2",
    "algorithm.rollouts=2",
    "algorithm.max_response_length=16",
    "algorithm.total_steps=6",
    "algorithm.save_freq=1",
    "algorithm.lr=1e-3",
    "trainer.threads=1",
    "storage.keep_last=2",
]
WORKER_TIMEOUT_S = 600  # a bound for a hang, with room for two other xdist workers beside


def plan_run(workdir: Path, model_dir: Path, mirror: Path, store: Store, *overrides: str) -> TrainSpec:
    """Write the train split to `store` and the worker's train_spec.json into `workdir`."""
    endpoint = [f"storage.endpoint_url={store.endpoint_url}"] if store.endpoint_url else []
    cfg = load_config(overrides=[f"model.name={model_dir}", f"storage.uri={store.uri}", *endpoint, *TINY_TRAIN,
                                 *overrides], env={})
    dataset = write_gsm8k_split(store, mirror, N_PROMPTS, "faults")
    cluster = Cluster(provider="local", name="faults", workdir=str(workdir), on_this_machine=True)
    return get_trainer("trl").plan(cfg, dataset, store, RUN_ID, cluster)


def worker_env(spec: TrainSpec, home: Path) -> dict[str, str]:
    return {**os.environ, **spec.env, "VERL_GRPO_HOME": str(home)}


class Worker:
    """The worker process; a thread reads its output so a test can wait for a line without blocking on it."""

    def __init__(self, spec: TrainSpec, home: Path, prefix: list[str] | None = None):
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*(prefix or []), *spec.command], env=worker_env(spec, home),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = WORKER_TIMEOUT_S) -> str | None:
        """The first new line matching predicate, or None when the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no matching line within {timeout}s; output:\n" + self.output()[-3000:]) from None
            if line is None:
                self._queue.put(None)  # later calls see the end too
                return None
            if predicate(line):
                return line

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.finish()

    def finish(self, timeout: float = WORKER_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)  # every line of the process is in self.lines
        return code

    def output(self) -> str:
        return "\n".join(self.lines)


def metrics_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def final_weights(store: Store) -> dict:
    from safetensors.torch import load

    with store.fs.open(store.path("runs", RUN_ID, "model", "model.safetensors"), "rb") as f:
        return load(f.read())


def assert_same_weights(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ from the uninterrupted run: {different[:5]}"


class TcpProxy:
    """A loopback TCP proxy to `target_port` that can go down (connections refused) and come back on its port."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.rate_bytes_per_s: float | None = None
        """Throttle of client→server bytes (uploads); None forwards at full speed."""
        self.on_upstream: Callable[[int], None] | None = None
        """Called with the running total of client→server bytes after each chunk."""
        self.upstream_bytes = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Stop listening and cut every open connection: the endpoint is gone until `up`."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            _close(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(64 << 10):
                if upstream:
                    if self.rate_bytes_per_s:
                        time.sleep(len(data) / self.rate_bytes_per_s)
                    with self._lock:
                        self.upstream_bytes += len(data)
                        total = self.upstream_bytes
                    if self.on_upstream is not None:
                        self.on_upstream(total)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


