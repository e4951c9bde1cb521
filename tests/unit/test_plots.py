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
