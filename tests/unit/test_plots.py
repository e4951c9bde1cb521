import json

from verl_grpo.contracts import EvalReport
from verl_grpo.registry.plots import accuracy_vs_base, reward_curve


def _report(acc):
    return EvalReport(model_uri="m", split="test", n=10, metrics={"accuracy": acc, "format_rate": 0.5, "mean_score": 0.4},
                      table_uri="t", settings_key="s")


def test_charts_are_pngs(tmp_path):
    lines = [json.dumps({"step": s, "reward": 0.1 * s, "rewards/correctness/mean": 0.05 * s}) for s in (1, 2, 3)]
    curve = reward_curve(lines, tmp_path / "curve.png")
    bars = accuracy_vs_base(_report(0.6), _report(0.4), tmp_path / "bars.png")
    for png in (curve, bars):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert reward_curve(["", json.dumps({"step": 1, "loss": 0.3})], tmp_path / "none.png") is None


def _bar_groups(png, monkeypatch, *reports):
    """The labels and bar heights accuracy_vs_base drew, read from its figure before it is closed."""
    import matplotlib.pyplot as plt

    from verl_grpo.registry import plots

    drawn = {}

    def keep(fig, out):
        ax = fig.axes[0]
        drawn["groups"] = [(c.get_label(), [round(b.get_height(), 3) for b in c]) for c in ax.containers]
        drawn["title"] = ax.get_title()
        plt.close(fig)
        return out

    monkeypatch.setattr(plots, "_save", keep)
    accuracy_vs_base(*reports[:2], png, *reports[2:])
    return drawn


def test_the_accuracy_bars_include_the_warm_start(tmp_path, monkeypatch):
    trained, base, warm = _report(0.6), _report(0.2), _report(0.5)
    png = accuracy_vs_base(trained, base, tmp_path / "three.png", warm)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = _bar_groups(tmp_path / "bars.png", monkeypatch, trained, base, warm)
    assert [label for label, _ in drawn["groups"]] == ["base", "warm start", "trained"]
    assert [heights[0] for _, heights in drawn["groups"]] == [0.2, 0.5, 0.6]  # accuracy of each model
    assert drawn["title"] == "test (n=10): trained vs warm start vs base"
    without = _bar_groups(tmp_path / "bars.png", monkeypatch, trained, base)
    assert [label for label, _ in without["groups"]] == ["base", "trained"]
