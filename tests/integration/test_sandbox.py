"""The MBPP execution pool against hostile programs; afterwards it still scores a correct program 1.0."""

import os
import uuid
from pathlib import Path

import pytest

from verl_grpo.rewards.sandbox import ExecutionPool, get_pool

CORRECT = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


@pytest.fixture(scope="module")
def pool():
    with ExecutionPool(workers=2, timeout_s=2.0) as p:
        yield p


def run(pool, code, tests=TESTS):
    return pool.run(code, tests)


def test_correct_and_partial_programs(pool):
    assert run(pool, CORRECT).passed == 3
    half = pool.run("def add(a, b):\n    return a + b if a >= 0 else 7\n", TESTS)
    assert (half.passed, half.total) == (2, 3) and half.pass_rate == pytest.approx(2 / 3)
    assert pool.run(CORRECT, ["assert add(1, 1) == 2"], setup_code="import math").passed == 1


@pytest.mark.parametrize("exit_call", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"])
def test_exiting_before_the_asserts_scores_zero(pool, exit_call):
    result = run(pool, CORRECT + exit_call)
    assert result.passed == 0, result


def test_exit_inside_a_test_fails_only_that_test(pool):
    code = CORRECT + "def boom():\n    import os\n    os._exit(0)\n"
    result = pool.run(code, ["assert add(1, 2) == 3", "assert boom() is None", "assert add(2, 2) == 4"])
    assert result.passed == 1


def test_infinite_loop_times_out(pool):
    result = run(pool, CORRECT + "while True:\n    pass\n")
    assert result.passed == 0 and "timeout" in result.reason


def test_fork_bomb_is_contained(pool):
    bomb = CORRECT + "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert run(pool, bomb).passed == 0
    assert run(pool, CORRECT).passed == 3


def test_memory_bomb_fails(pool):
    result = run(pool, CORRECT + "hog = bytearray(4 * 1024 ** 3)\n")
    assert result.passed == 0 and "MemoryError" in result.reason


def test_output_flood_does_not_hang_the_pool(pool):
    flood = CORRECT + "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n"
    assert run(pool, flood).passed == 0


def test_writes_outside_the_workdir_leave_no_trace(pool):
    name = f"verl-grpo-sandbox-escape-{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, Path("/var/tmp") / name, Path.home() / name, Path.cwd() / name]
    writer = "def add(a, b):\n    for p in %r:\n        try:\n            open(p, 'w').write('x')\n        except OSError:\n            pass\n    return a + b\n" % [
        str(t) for t in targets
    ]
    assert run(pool, writer).passed == 3  # the program ran its writes
    if pool.isolation != "namespaces":
        targets = [t for t in targets if not str(t).startswith(("/tmp", "/var/tmp"))]
    assert [t for t in targets if t.exists()] == []


def test_program_cannot_see_secrets_of_the_parent(pool, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "parent-secret-value")
    monkeypatch.setenv("HF_TOKEN", "hf_parent_token")
    # A fresh pool: its workers start after the secrets are in the parent's environment.
    with ExecutionPool(workers=1, timeout_s=2.0) as fresh:
        probe = (
            "import os, glob\n"
            "def leaked():\n"
            "    if 'AWS_SECRET_ACCESS_KEY' in os.environ or 'HF_TOKEN' in os.environ:\n"
            "        return True\n"
            "    for f in glob.glob('/proc/*/environ'):\n"
            "        try:\n"
            "            if b'parent-secret-value' in open(f, 'rb').read():\n"
            "                return True\n"
            "        except OSError:\n"
            "            pass\n"
            "    return False\n"
        )
        result = fresh.run(probe, ["assert leaked() is False", "assert os.environ.get('HOME') == os.getcwd()"])
        assert result.passed == 2, result


def test_network_is_unreachable(pool):
    probe = (
        "import socket\n"
        "def connects():\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 22), timeout=1).close()\n"
        "    except OSError:\n"
        "        return False\n"
        "    return True\n"
    )
    listening = "import socket\nsrv = socket.create_server(('127.0.0.1', 0))\n" if pool.network == "shared" else ""
    # With a shared network (no namespace) a server in the program itself must still be unreachable.
    assert pool.run(listening + probe, ["assert connects() is False"]).passed == 1


def test_killing_the_parent_does_not_take_down_the_pool(pool):
    killer = CORRECT + "import os, signal\nfor pid in (os.getppid(), 0, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
    run(pool, killer)
    assert os.getpid() > 0  # this process survived
    assert run(pool, CORRECT).passed == 3


def test_forged_results_are_not_counted(pool):
    forger = CORRECT + "import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'0\\n1\\n2\\n:0\\n')\n    except OSError:\n        pass\nos._exit(0)\n"
    assert run(pool, forger).passed == 0


def test_a_hung_worker_is_replaced(pool):
    worker = pool._idle.get()
    worker.proc.kill()  # the next job finds the worker dead
    worker.proc.wait()
    pool._idle.put(worker)
    before = pool.replaced
    results = pool.map([(CORRECT, TESTS, "")] * 4)
    assert pool.replaced == before + 1
    assert sum("replaced" in r.reason for r in results) == 1
    assert run(pool, CORRECT).passed == 3


def test_pool_still_scores_a_correct_program_after_everything(pool):
    results = pool.map([(CORRECT, TESTS, "")] * 6)
    assert [r.pass_rate for r in results] == [1.0] * 6


def test_get_pool_is_lazy_and_shared():
    assert get_pool() is get_pool()
    assert get_pool().run(CORRECT, TESTS).passed == 3
