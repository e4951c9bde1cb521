"""A run's log opens with what happened, not with progress bars and blank lines: the training worker draws no
bars, and a job's log streamed into the run's log (the Prefect flow run's, the CLI's) leaves out the blank lines and
bar redraws a job's output may still hold, while the trainer's `step k/N` lines stay."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from verl_grpo.contracts import Job, JobState
from verl_grpo.providers.base import follow_job, readable_line
from verl_grpo.providers.local import LocalProvider

BARS = ("\rTokenizing train dataset:   0%|          | 0/8 [00:00<?, ? examples/s]"
        "\rTokenizing train dataset: 100%|██████████| 8/8 [00:00<00:00, 912.31 examples/s]\n"
        "\rMap: 100%|██████████| 8/8 [00:00<00:00, 1500.00 examples/s]\n")
LOG = ("warm-start: 4 SFT steps on 8 rewritten gsm8k train solutions (lr 5e-05, 2 per step)\n" + BARS + "\n"
       "(WorkerDict pid=42) Processed prompts: 100%|██████████| 64/64 [00:03<00:00, 18.2it/s]\n"
       "Training Progress:   2%|▏         | 1/50 [00:07<05:43, 7.01s/it]\n"
       "Loading weights: 3it [00:01,  2.10it/s]\n"
       "warm-start 1/4 loss=7.999 s/step=0.799\n   \n"
       "step 1/4 reward=0.25 reward_std=0.1 len=16 s/step=0.8\n"
       "reward 100%|correct| is a line a user wrote\n")
KEPT = ["warm-start: 4 SFT steps on 8 rewritten gsm8k train solutions (lr 5e-05, 2 per step)",
        "warm-start 1/4 loss=7.999 s/step=0.799", "step 1/4 reward=0.25 reward_std=0.1 len=16 s/step=0.8",
        "reward 100%|correct| is a line a user wrote"]


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def _blank_or_bar(message: str) -> bool:
    return not message.strip() or "\r" in message or "it/s]" in message or "examples/s]" in message or \
        "s/it]" in message


def test_a_jobs_log_reaches_the_run_log_without_bars_or_blank_lines(tmp_path, monkeypatch):
    """The local provider reads the job's log with universal newlines, as it did: each `\\r` redraw is a line."""
    log_path = tmp_path / "train.log"
    log_path.write_text(LOG, encoding="utf-8")
    provider = LocalProvider(root=tmp_path)
    monkeypatch.setattr(provider, "status", lambda job: JobState(phase="SUCCEEDED"))
    logger = logging.getLogger("verl_grpo.test_run_log")
    capture = _Capture()
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        state = follow_job(provider, Job(provider="local", id="1", name="t", log_path=str(log_path)), logger.info)
    finally:
        logger.removeHandler(capture)
    messages = [record.getMessage() for record in capture.records]
    assert state.phase == "SUCCEEDED"
    assert not [m for m in messages if _blank_or_bar(m)], messages
    assert messages == KEPT  # the trainer's own progress lines and every other line, in order
    assert "" in list(provider.logs(Job(provider="local", id="1", name="t", log_path=str(log_path))))  # raw: blanks


@pytest.mark.parametrize("line", ["", "  ", "\r", "Map:  40%|████      | 4/10 [00:01<00:02, 3.1 examples/s]",
                                  "\rA:   0%|  | 0/8\rA: 100%|██| 8/8 [00:00<00:00, 9.1it/s]"])
def test_blank_lines_and_bars_are_left_out(line):
    assert readable_line(line) is None


def test_a_line_after_a_carriage_return_is_what_a_terminal_shows():
    assert readable_line("Map: 100%|██| 8/8 [00:00<00:00, 9.1it/s]\rstep 2/4 reward=1") == "step 2/4 reward=1"
    assert readable_line("step 3/4 reward=0.5  ") == "step 3/4 reward=0.5"


MAP = """
import sys
{setup}
import datasets
datasets.Dataset.from_dict({{"x": list(range(50))}}).map(lambda row: row)
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_the_worker_draws_no_datasets_bars(quiet):
    """What printed the bars in a warm-started run: datasets' `map` (TRL tokenizing the SFT set), run in a process
    set up as the training workers set up theirs; without the setting it draws them, so the check can fail."""
    setup = "from verl_grpo.trainers.worker.quiet import no_progress_bars; no_progress_bars()" if quiet else ""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run([sys.executable, "-c", MAP.format(setup=setup)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert ("%|" in output) is not quiet, output[-2000:]
