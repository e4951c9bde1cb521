"""Reward benchmarks P1-P3; writes bench/results/rewards.md and prints it.

P1  our GSM8K scorer vs verl.utils.reward_score.gsm8k.compute_score (strict `####`), on gold
    solutions and perturbations: throughput and verdict agreement by category.
P2  our MATH scorer vs Math-Verify called directly, on MATH-500 answers (gold, and a wrong answer
    borrowed from the next problem): agreement and time.
P3  the execution pool vs one fresh `subprocess.run([python, file])` per program, on MBPP test gold
    solutions plus broken variants: same verdicts, throughput.

Run: `python bench/rewards_bench.py` (a few minutes on 2 cores). Numbers depend on machine load.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from math_verify import parse, verify
from verl.utils.reward_score import gsm8k as verl_gsm8k

from verl_grpo.local_paths import data_mirror_dir
from verl_grpo.rewards import compute_score
from verl_grpo.rewards.math_ import MATH_VERIFY_TIMEOUT_S
from verl_grpo.rewards.sandbox import ExecutionPool

RESULTS = Path(__file__).resolve().parent / "results" / "rewards.md"


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def with_commas(n: str) -> str:
    try:
        return f"{int(n):,}"
    except ValueError:
        return n


# ---------------------------------------------------------------------------------------------- P1


def gsm8k_cases(rows: list[dict]) -> list[tuple[str, str, str, bool]]:
    """(category, response, ground truth, expected correct) for every gold solution and perturbation."""
    cases = []
    for row in rows:
        reasoning, _, n = row["answer"].rpartition("####")
        reasoning, n = reasoning.strip(), n.strip().replace(",", "")
        wrong = str(int(float(n)) + 1) if re.fullmatch(r"-?\d+(\.\d+)?", n) else n + "1"
        ours = lambda a: f"<think>{reasoning}</think>\n<answer>{a}</answer>"  # noqa: E731
        cases += [
            ("gold, answer block", ours(n), n, True),
            ("gold, #### line", f"{reasoning}\n#### {n}", n, True),
            ("wrong number, answer block", ours(wrong), n, False),
            ("wrong number, #### line", f"{reasoning}\n#### {wrong}", n, False),
            ("two answers in block", ours(f"{wrong} or {n}"), n, False),
            ("no format, 'the answer is'", f"{reasoning}\nThe answer is {n}.", n, True),
            ("thousands commas, #### line", f"{reasoning}\n#### {with_commas(n)}", n, True),
            ("dollar sign in block", ours(f"${n}"), n, True),
        ]
    return cases


def bench_p1(rows: list[dict]) -> list[str]:
    cases = gsm8k_cases(rows)
    t0 = time.perf_counter()
    ours = [compute_score("gsm8k", resp, gt)["correctness"] == 1.0 for _, resp, gt, _ in cases]
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = [verl_gsm8k.compute_score(resp, gt) == 1.0 for _, resp, gt, _ in cases]
    t_verl = time.perf_counter() - t0

    by_cat: dict[str, Counter] = defaultdict(Counter)
    for (cat, _, _, expected), a, b in zip(cases, ours, theirs):
        c = by_cat[cat]
        c["n"] += 1
        c["agree"] += a == b
        c["ours_right"] += a == expected
        c["verl_right"] += b == expected
    agree = sum(a == b for a, b in zip(ours, theirs))
    n = len(cases)
    lines = [
        "## P1 — GSM8K: ours vs `verl.utils.reward_score.gsm8k.compute_score`",
        "",
        f"{n} responses from {len(rows)} GSM8K test gold solutions × {len(by_cat)} variants.",
        "",
        "| metric | ours | verl | ratio (ours/verl) |",
        "|---|---|---|---|",
        f"| throughput (responses/s) | {n / t_ours:,.0f} | {n / t_verl:,.0f} | {t_verl / t_ours:.2f}× |",
        f"| verdicts matching the intended label | {sum(c['ours_right'] for c in by_cat.values())}/{n} "
        f"| {sum(c['verl_right'] for c in by_cat.values())}/{n} | |",
        "",
        f"Verdict agreement: **{agree}/{n} ({100 * agree / n:.1f}%)**.",
        "",
        "| category | n | agree | ours right | verl right |",
        "|---|---|---|---|---|",
    ]
    for cat, c in by_cat.items():
        lines.append(f"| {cat} | {c['n']} | {c['agree']} | {c['ours_right']} | {c['verl_right']} |")
    lines += [
        "",
        "Disagreements, by category: verl's scorer only reads a `#### n` line in the last 300 characters "
        "(strict format), so it marks every answer-block response wrong, gold included, and also "
        "'the answer is n' responses; it strips commas, so comma answers agree. Ours reads the answer "
        "block first and falls back to `####`/`\\boxed`/'the answer is'; it rejects blocks stating two "
        "different numbers.",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------------------------- P2


def direct_math_verify(gold: str, answer: str) -> bool:
    return verify(
        parse("\\boxed{" + gold + "}", parsing_timeout=MATH_VERIFY_TIMEOUT_S),
        parse("\\boxed{" + answer + "}", parsing_timeout=MATH_VERIFY_TIMEOUT_S),
        timeout_seconds=MATH_VERIFY_TIMEOUT_S,
    )


def bench_p2(rows: list[dict]) -> list[str]:
    pairs = [(r["answer"], r["answer"], "gold") for r in rows]
    pairs += [(r["answer"], rows[(i + 1) % len(rows)]["answer"], "other problem's answer") for i, r in enumerate(rows)]
    t0 = time.perf_counter()
    ours = [
        compute_score("math", f"<think>Done.</think>\n<answer>{ans}</answer>", gold)["correctness"] == 1.0
        for gold, ans, _ in pairs
    ]
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = [direct_math_verify(gold, ans) for gold, ans, _ in pairs]
    t_direct = time.perf_counter() - t0
    lines = [
        "## P2 — MATH-500: ours vs Math-Verify directly (`verify(parse(\\boxed{gold}), parse(\\boxed{answer}))`)",
        "",
        "| set | n | agreement | ours correct | math-verify correct |",
        "|---|---|---|---|---|",
    ]
    for kind in ("gold", "other problem's answer"):
        idx = [i for i, p in enumerate(pairs) if p[2] == kind]
        agree = sum(ours[i] == theirs[i] for i in idx)
        lines.append(
            f"| {kind} | {len(idx)} | {agree}/{len(idx)} ({100 * agree / len(idx):.1f}%) "
            f"| {sum(ours[i] for i in idx)} | {sum(theirs[i] for i in idx)} |"
        )
    lines += [
        "",
        "| metric | ours | math-verify direct | ratio (ours/direct) |",
        "|---|---|---|---|",
        f"| time for {len(pairs)} responses (s) | {t_ours:.2f} | {t_direct:.2f} | {t_ours / t_direct:.2f}× |",
        "",
        "Ours adds response parsing and caches the parsed gold; both call the same parse/verify.",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------------------------- P3


def mbpp_programs(rows: list[dict]) -> list[tuple[str, str, list[str], str]]:
    """(kind, code, tests, setup): each gold solution, and a broken variant that shadows the function."""
    out = []
    for r in rows:
        out.append(("gold", r["code"], r["test_list"], r["test_setup_code"]))
        m = re.search(r"assert\s+\(?\s*(?:set\()?\s*(\w+)\s*\(", r["test_list"][0])
        name = m.group(1) if m else "solution"
        out.append(("broken", f"{r['code']}\ndef {name}(*args, **kwargs):\n    return "
                              "None\n", r["test_list"], r["test_setup_code"]))
    return out


def subprocess_verdict(code: str, tests: list[str], setup: str, timeout_s: float) -> bool:
    """The naive baseline: a fresh interpreter per program; all asserts pass ⇔ exit code 0."""
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "prog.py"
        script.write_text(f"{code}\n{setup}\n" + "\n".join(tests) + "\n")
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=d, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0


def bench_p3(rows: list[dict], timeout_s: float = 5.0) -> list[str]:
    programs = mbpp_programs(rows)
    with ExecutionPool(timeout_s=timeout_s) as pool:
        pool.map([(c, t, s) for _, c, t, s in programs[:8]])  # warm-up
        t0 = time.perf_counter()
        results = pool.map([(c, t, s) for _, c, t, s in programs])
        t_pool = time.perf_counter() - t0
        workers, isolation = pool.size, pool.isolation
    pool_verdicts = [r.passed == r.total for r in results]

    t0 = time.perf_counter()
    sub_verdicts = [subprocess_verdict(c, t, s, timeout_s) for _, c, t, s in programs]
    t_sub = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda p: subprocess_verdict(p[1], p[2], p[3], timeout_s), programs))
    t_sub_par = time.perf_counter() - t0

    n = len(programs)
    same = sum(a == b for a, b in zip(pool_verdicts, sub_verdicts))
    diffs = [(programs[i][0], rows[i // 2]["task_id"], results[i].reason) for i in range(n) if pool_verdicts[i] != sub_verdicts[i]]
    lines = [
        "## P3 — MBPP execution pool vs one `subprocess.run([python, file])` per program",
        "",
        f"{n} programs: {len(rows)} MBPP test gold solutions (task_ids 11–510) + one broken variant each; "
        f"pool: {workers} workers, isolation `{isolation}`, timeout {timeout_s:.0f}s.",
        "",
        "| metric | pool | subprocess.run, sequential | ratio |",
        "|---|---|---|---|",
        f"| wall time (s) | {t_pool:.2f} | {t_sub:.2f} | |",
        f"| throughput (programs/s) | {n / t_pool:,.1f} | {n / t_sub:,.1f} | **{t_sub / t_pool:.1f}×** |",
        f"| all-tests-passed verdicts, gold | {sum(v for (k, *_), v in zip(programs, pool_verdicts) if k == 'gold')} "
        f"| {sum(v for (k, *_), v in zip(programs, sub_verdicts) if k == 'gold')} | |",
        "| all-tests-passed verdicts, broken | "
        f"{sum(v for (k, *_), v in zip(programs, pool_verdicts) if k == 'broken')} "
        f"| {sum(v for (k, *_), v in zip(programs, sub_verdicts) if k == 'broken')} | |",
        "",
        f"Same verdict on **{same}/{n}** programs. Subprocess.run with {workers} threads in parallel: "
        f"{t_sub_par:.2f}s ({n / t_sub_par:,.1f}/s; pool is {t_sub_par / t_pool:.1f}× faster than that too).",
        "",
    ]
    if diffs:
        lines += ["Different verdicts (kind, task_id, pool reason):", ""]
        lines += [f"- {kind} task {tid}: {reason}" for kind, tid, reason in diffs[:20]]
        lines.append("")
    return lines


def main() -> None:
    data = data_mirror_dir()
    started = time.perf_counter()
    out = [
        "# Reward benchmarks",
        "",
        f"Machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}. "
        "Timings are wall-clock and vary with machine load.",
        "",
    ]
    out += bench_p1(read_jsonl(data / "gsm8k" / "test.jsonl"))
    out += bench_p2(read_jsonl(data / "math" / "test.jsonl"))
    mbpp = [r for r in read_jsonl(data / "mbpp" / "mbpp.jsonl") if 11 <= r["task_id"] <= 510]
    out += bench_p3(mbpp)
    out.append(f"Total benchmark time: {time.perf_counter() - started:.0f}s.")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
