"""The response format every prompt asks for and every scorer checks: reasoning, then one answer block."""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_MATH_SYSTEM = (
    "You are a careful problem solver. First reason step by step inside <think> </think>. "
    "Then give only the final answer inside <answer> </answer>{answer_hint}, and write nothing after it."
)

SYSTEM_PROMPTS: dict[str, str] = {
    "gsm8k": _MATH_SYSTEM.format(answer_hint=" as a plain number"),
    "math": _MATH_SYSTEM.format(answer_hint=" in simplest LaTeX form, e.g. <answer>\\frac{1}{2}</answer>"),
    "mbpp": (
        "You are an expert Python programmer. First reason briefly inside <think> </think>. "
        "Then give the complete solution inside <answer> </answer> as one ```python code block that defines "
        "the requested function, and write nothing after it."
    ),
    "squad": (
        "You answer questions about Wikipedia articles. Call the search tool to look up passages when you need "
        "them. First reason briefly inside <think> </think>. Then give only the short answer, a few words taken "
        "from the passage, inside <answer> </answer>, and write nothing after it."
    ),
    "nq_hotpotqa": (
        "You answer open-domain questions with facts from Wikipedia. Call the search tool to look up passages when "
        "you need them. First reason briefly inside <think> </think>. Then give only the short answer, a few words, "
        "inside <answer> </answer>, and write nothing after it."
    ),
}


OWN_TASK_SYSTEM_PROMPT = _MATH_SYSTEM.format(answer_hint="")
"""The default prompt of a task of your own (`custom`) and of reasoning-gym's: the shared layout, no answer hint. Kept
out of SYSTEM_PROMPTS, the shipped datasets' prompts that the tiny model's tokenizer is trained on: its words are all
in GSM8K's, and the tiny model stays the one the tests were tuned on."""


def default_system_prompt(dataset: str) -> str:
    return SYSTEM_PROMPTS[dataset] if dataset in SYSTEM_PROMPTS else OWN_TASK_SYSTEM_PROMPT


_USER_TURNS = (
    ("<|im_start|>user", "<|im_end|>"),  # ChatML (Qwen, the tiny model)
    ("<|start_header_id|>user<|end_header_id|>", "<|eot_id|>"),  # Llama 3
    ("<start_of_turn>user", "<end_of_turn>"),  # Gemma
)


def question_of(prompt: str) -> str:
    """The question a rendered chat prompt asks: its last user turn's text, without the system prompt and the
    template's markers, so a table or a page leads with it; a plain prompt (no known template) comes back as is,
    stripped. A prompt cut before its user turn ends keeps what is there."""
    for open_tag, close_tag in _USER_TURNS:
        start = prompt.rfind(open_tag)
        if start < 0:
            continue
        body = prompt[start + len(open_tag):]
        end = body.find(close_tag)
        return (body if end < 0 else body[:end]).strip()
    return prompt.strip()
