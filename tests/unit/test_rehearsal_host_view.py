"""What of this machine a rehearsal node sees: the OS directories, its /tmp, and only the rehearsal's own paths."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from verl_grpo_rehearsal.controller import NAMESPACE_FLAGS, HostView, _namespaces_work


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for name in ("usr", "etc", "tmp", "work", "opt", "home"):
        (root / name).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "info.json").write_text("{}")
    return root


def test_every_top_level_dir_but_the_os_ones_is_hidden_and_kept_paths_inside_them_are_parked(tmp_path):
    root = fake_root(tmp_path)
    view = HostView([root / "work/clone/.venv", root / "work/clone/.venv/lib", root / "tmp/state",
                     root / "work/clone/verl_grpo"], root=root)
    assert view.hidden == [root / "home", root / "opt", root / "work"]
    assert view.keep_under_tmp == [root / "tmp/state"]
    assert view.keep_hidden == [root / "work/clone/.venv", root / "work/clone/verl_grpo"]
    commands = view.hide_commands(Path("/tmp/stage"))
    parks = [i for i, c in enumerate(commands) if c.startswith("mkdir -p /tmp/stage/")]
    covers = [i for i, c in enumerate(commands) if c.startswith("mount -t tmpfs")]
    back = [i for i, c in enumerate(commands) if "umount -l" in c]
    assert len(parks) == 2 and len(covers) == 3 and len(back) == 2
    assert max(parks) < min(covers) and max(covers) < min(back), "park, cover, then put back"
    assert commands[-1] == "rm -rf /tmp/stage"


@pytest.mark.skipif(not _namespaces_work(), reason="needs user namespaces")
def test_in_a_node_namespace_a_hidden_dir_is_empty_and_a_kept_path_inside_it_is_intact(tmp_path):
    here = Path(__file__).resolve()
    repo = here.parents[2]
    view = HostView([repo / "verl_grpo"])
    if not any(repo.is_relative_to(h) for h in view.hidden):
        pytest.skip("the checkout lies in an OS directory here")
    script = " && ".join([*view.hide_commands(tmp_path / "stage"),
                          f"test ! -e {repo / 'pyproject.toml'}", f"test ! -e {here}",
                          f"test -e {repo / 'verl_grpo' / '__init__.py'}", "echo ok"])
    out = subprocess.run(["unshare", *NAMESPACE_FLAGS, "bash", "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
