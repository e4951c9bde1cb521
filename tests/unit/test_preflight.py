"""The training task's setup ends by finding every package its run imports: a missing one fails setup (never retried
by SkyPilot) instead of run (restarted max_restarts_on_errors times, each paying setup, download and vLLM start)."""

from __future__ import annotations

import subprocess
import sys

from verl_grpo.trainers.verl import preflight


def test_a_package_setup_never_installed_fails_setup_with_one_line_naming_it():
    result = subprocess.run([sys.executable, "-m", preflight.__name__, "verl", "tenacity", "flash_attn"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "preflight: No module named 'flash_attn' on this node: its run imports it",
        "preflight: this node's setup does not install what its run imports; failing setup (not retried)"]


def test_a_node_with_every_package_passes_without_importing_them():
    assert preflight.main(["verl", "tenacity", "math_verify"]) == 0
    code = ("import sys; from verl_grpo.trainers.verl.preflight import missing; "
            "assert missing(['verl', 'math_verify']) == []; assert 'verl' not in sys.modules, 'verl was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
