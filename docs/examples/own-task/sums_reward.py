"""Reward of the `sums` example task, with verl's compute_score signature (docs/own-task.md).

Full marks for exactly one <answer> block holding the right number, a little for answering in the block at all.
"""

import re

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    blocks = ANSWER.findall(solution_str)
    answered = len(blocks) == 1
    correct = answered and blocks[0].replace(",", "") == str(ground_truth)
    return {"score": 0.9 * correct + 0.1 * answered, "acc": float(correct), "correct": float(correct),
            "answered": float(answered)}
