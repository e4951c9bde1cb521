"""Generation backends of the evaluator: the `Generator` protocol and its Hugging Face (CPU) implementation.

Generation is the only backend-specific step of an evaluation: plan, scoring and aggregation (runner.py)
are shared. `HFGenerator` generates with transformers on CPU: prompts longest-first in left-padded
batches (similar lengths pad little), outputs put back in the caller's order. The vLLM implementation
for GPU clusters is `verl_grpo.evaluate.vllm_runner.VLLMGenerator`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from verl_grpo.errors import ConfigError

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedTokenizerBase

# torch and transformers are imported where they are used: every CLI and flow process imports this module through
# the evaluate step, and their import alone costs seconds of CPU that most of those processes never need.

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    batch_size: int = 16
    samples: int = 1
    """Responses per prompt; 1 with do_sample False is greedy decoding."""
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def key_fields(self) -> dict[str, Any]:
        """What changes the generated text. Greedy text depends on the batch size only through float rounding
        of padded batches (ignored); samples do, since batching decides which random draws each prompt gets."""
        fields: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "samples": self.samples,
                                  "do_sample": self.do_sample}
        if self.do_sample:
            fields.update(temperature=self.temperature, top_p=self.top_p, seed=self.seed, batch_size=self.batch_size)
        return fields


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: int
    """Generated tokens including the end-of-sequence token when the model emitted one."""
    finished: bool
    """False when the budget ran out before an end-of-sequence token."""
    ids: tuple[int, ...] = ()
    """The generated token ids (through the end-of-sequence token); empty from generators that do not keep them."""
    tool_calls: int | None = None
    """Tool calls the response made (evaluate.tool_loop); None when no tool was offered."""
    transcript: str = ""
    """With tools: everything after the prompt, the tool results included, special tokens kept."""


class Generator(Protocol):
    """One generation backend: renders chat prompts with the model's template and generates responses."""

    def render_prompts(self, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
        """Chat-templated prompt text of each conversation, ready for generation."""

    def generate(self, prompts: Sequence[str], params: GenerationParams,
                 progress: Progress | None = None) -> list[list[Generation]]:
        """`params.samples` generations per prompt, in the order of `prompts`; progress(done, total) in prompts."""


class HFGenerator:
    """Generator on Hugging Face transformers (CPU), loading the model once."""

    def __init__(self, model_dir: Path, dtype: str = "float32", threads: int | None = None):
        self.model, self.tokenizer = load_model(model_dir, dtype)
        self.threads = threads

    def render_prompts(self, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
        return render_prompts(self.tokenizer, conversations)

    def generate(self, prompts: Sequence[str], params: GenerationParams,
                 progress: Progress | None = None) -> list[list[Generation]]:
        import torch

        previous = torch.get_num_threads()
        # More torch threads than free cores makes CPU decoding several times slower, not faster.
        torch.set_num_threads(self.threads or previous)
        try:
            return generate(self.model, self.tokenizer, prompts, params, progress)
        finally:
            torch.set_num_threads(previous)


def check_chat_template(tokenizer: Any, model_dir: Path | str) -> None:
    """ConfigError unless the tokenizer can render chat prompts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer of {model_dir} has no chat template; evaluate a chat/instruct model "
                          "or add `chat_template` to its tokenizer_config.json")


def load_model(model_dir: Path, dtype: str = "float32") -> tuple[Any, PreTrainedTokenizerBase]:
    """Model in eval mode and a left-padding tokenizer with a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_chat_template(tokenizer, model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    model.eval()
    return model, tokenizer


def render_prompts(tokenizer: PreTrainedTokenizerBase, conversations: Sequence[list[dict[str, str]]],
                   tools: list[dict] | None = None) -> list[str]:
    """Each conversation through the chat template, with the generation prompt (and the tool list, when given)."""
    return [tokenizer.apply_chat_template(list(c), tools=tools, add_generation_prompt=True, tokenize=False)
            for c in conversations]


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of rendered prompts; the chat template already placed any special tokens (no second BOS)."""
    return [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]


def generate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    params: GenerationParams,
    progress: Progress | None = None,
) -> list[list[Generation]]:
    """`params.samples` generations per prompt, in the order of `prompts`."""
    import torch

    encoded = encode_prompts(tokenizer, prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]), reverse=True)
    results: list[list[Generation]] = [[] for _ in prompts]
    gen_config = _generation_config(model, tokenizer, params)
    eos_ids = set(_as_list(gen_config.eos_token_id))
    if params.do_sample:
        torch.manual_seed(params.seed)
    done = 0
    for start in range(0, len(order), params.batch_size):
        batch = order[start : start + params.batch_size]
        inputs = tokenizer.pad({"input_ids": [encoded[i] for i in batch]}, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, generation_config=gen_config)
        new_tokens = out[:, inputs["input_ids"].shape[1] :].tolist()
        for row, ids in enumerate(new_tokens):
            results[batch[row // params.samples]].append(_decode(tokenizer, ids, eos_ids))
        done += len(batch)
        if progress is not None:
            progress(done, len(prompts))
    return results


def _generation_config(model: Any, tokenizer: PreTrainedTokenizerBase, params: GenerationParams) -> GenerationConfig:
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    common: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, num_return_sequences=params.samples,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
    if params.do_sample:
        return GenerationConfig(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0,
                                **common)
    return GenerationConfig(do_sample=False, **common)


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int], eos_ids: set[int]) -> Generation:
    end = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), None)
    kept = ids if end is None else ids[:end]
    return Generation(text=tokenizer.decode(kept, skip_special_tokens=True), tokens=len(kept), finished=end is not None,
                      ids=tuple(kept))


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
