"""GPU only: what `attn_implementation=sdpa` without remove-padding costs the shipped gsm8k update.

verl 0.9.1 defaults the actor to `flash_attention_2` with `use_remove_padding=True`: each micro-batch is unpadded
into one packed row of the real tokens. Without flash-attn the coherent choice is `sdpa` with
`use_remove_padding=False`, and then every sequence is computed at its padded length
(max_prompt_length + max_response_length). This measures both on the shipped shape (Qwen2.5-1.5B, 512 + 512
tokens, micro-batch 8, gradient checkpointing on, bf16) with random weights (no hub on the GPU machine):

- padded: `[8, 1024]` with an attention mask, sdpa (what the sdpa setting computes);
- packed, two ways, both in remove-padding's layout (`[1, real tokens]`, positions restarting per sequence; the
  linear layers see exactly the real tokens): `per-seq sdpa` runs causal sdpa on each sequence's slice (one
  launch per sequence and layer); `flex` runs compiled flex_attention with a document-causal block mask (one
  launch per layer, masked blocks skipped, as flash-attn's varlen kernel does). flex's row is padded to a fixed
  length per scenario with one filler sequence (counted against it) so that it compiles once.
  flash-attn itself cannot be installed on the machine this ran on (no package registry).

Prompt lengths come from `--prompt-lengths` (a JSON list written by `bench/gsm8k_prompt_lengths.py` from the
shared GSM8K train split); response lengths are the scenarios below. Writes a markdown table to `--out`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

QWEN25_15B = dict(  # Qwen/Qwen2.5-1.5B-Instruct config.json (architecture only; weights are random here)
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu",
)
MAX_PROMPT, MAX_RESPONSE, MICRO = 512, 512, 8
SCENARIOS = {  # name -> (low, high) of uniformly drawn response lengths
    "responses 128-384 tokens": (128, 384),
    "responses 256-512 tokens": (256, 512),
    "responses all 512 (capped)": (512, 512),
}


SEGMENTS: list[int] = []  # sequence lengths of the packed row being computed
FLEX: dict = {}  # the compiled flex_attention and the block mask of the row being computed


def segmented_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """varlen attention over the packed row: causal sdpa on each sequence's slice ([1, heads, T, dim] in)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    outs, start = [], 0
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):  # never the math fallback
        for n in SEGMENTS:
            q, k, v = (t[:, :, start:start + n].contiguous() for t in (query, key, value))
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling))
            start += n
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def flex_doc(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """flex_attention over the packed row with its document-causal block mask."""
    out = FLEX["fn"](query, key, value, block_mask=FLEX["mask"], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def document_mask(lengths: list[int]):
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))

    def causal_within_document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    return create_block_mask(causal_within_document, None, None, len(doc), len(doc), device="cuda")


def build_model():
    from torch.nn.attention.flex_attention import flex_attention
    from transformers import AttentionInterface, AutoModelForCausalLM, Qwen2Config

    AttentionInterface.register("segmented_sdpa", segmented_sdpa)
    AttentionInterface.register("flex_doc", flex_doc)
    FLEX["fn"] = torch.compile(flex_attention, dynamic=False) if torch.cuda.is_available() else flex_attention

    config = Qwen2Config(**QWEN25_15B)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    return model


def padded_batch(prompts: list[int], responses: list[int]) -> dict:
    """verl's layout: prompts left-padded to MAX_PROMPT, responses right-padded to MAX_RESPONSE."""
    n = len(prompts)
    ids = torch.randint(100, 150000, (n, MAX_PROMPT + MAX_RESPONSE), device="cuda")
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[i, MAX_PROMPT - p:MAX_PROMPT + r] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}


def packed_batch(prompts: list[int], responses: list[int], attn: str, row_len: int | None = None) -> dict:
    """remove-padding's layout: the real tokens of the micro-batch in one row, positions restarting per sequence
    (and a filler sequence up to `row_len` when given)."""
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    if row_len is not None and row_len > sum(lengths):
        lengths.append(row_len - sum(lengths))
    ids = torch.randint(100, 150000, (1, sum(lengths)), device="cuda")
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": position_ids, "lengths": lengths, "attn": attn,
            "mask": document_mask(lengths) if attn == "flex_doc" else None}


def step(model, batch: dict[str, torch.Tensor]) -> None:
    """Forward + next-token log-probs in fp32 (as verl's actor computes them) + backward."""
    SEGMENTS[:] = batch.get("lengths", [])
    FLEX["mask"] = batch.get("mask")
    model.set_attn_implementation(batch.get("attn", "sdpa"))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                   position_ids=batch["position_ids"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = batch["input_ids"][:, 1:].unsqueeze(-1)
    loss = -logp.gather(-1, target).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(model, batches: list[dict[str, torch.Tensor]], warmup: int) -> tuple[float, float]:
    """Median seconds per micro-batch and peak GiB allocated, over `batches` after `warmup` of them."""
    for b in batches[:warmup]:
        step(model, b)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for b in batches[warmup:]:
        t0 = time.perf_counter()
        step(model, b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-lengths", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--micro-batches", type=int, default=6, help="timed micro-batches per side (after 2 warm-ups)")
    args = ap.parse_args(argv)

    prompt_pool = [n for n in json.loads(args.prompt_lengths.read_text()) if n <= MAX_PROMPT]
    rng = random.Random(0)
    model = build_model()
    rows = []
    for name, (lo, hi) in SCENARIOS.items():
        draws = [([rng.choice(prompt_pool) for _ in range(MICRO)], [rng.randint(lo, hi) for _ in range(MICRO)])
                 for _ in range(args.micro_batches + 2)]
        real = statistics.mean(sum(p) + sum(r) for p, r in draws)
        row_len = -(-max(sum(p) + sum(r) for p, r in draws) // 128) * 128
        sides = {
            "padded": [padded_batch(p, r) for p, r in draws],
            "per-seq sdpa": [packed_batch(p, r, "segmented_sdpa") for p, r in draws],
            "flex": [packed_batch(p, r, "flex_doc", row_len) for p, r in draws],
        }
        measured = {side: timed(model, batches, warmup=2) for side, batches in sides.items()}
        rows.append((name, real, row_len, measured))
        print(name, {side: f"{s:.3f} s {gib:.1f} GiB" for side, (s, gib) in measured.items()}, flush=True)

    gpu = torch.cuda.get_device_name()
    steps_per_update = 32 * 8 // MICRO  # train_batch_size 32 x rollouts 8, one epoch
    lines = [
        "# sdpa (padded) vs remove-padding (packed): one actor micro-batch, forward + backward",
        "",
        f"Measured on {gpu} with `python bench/gpu_attention.py` (torch {torch.__version__}); Qwen2.5-1.5B shape, "
        f"random bf16 weights, gradient checkpointing, micro-batch {MICRO}, max_prompt_length {MAX_PROMPT}, "
        f"max_response_length {MAX_RESPONSE}. Prompt lengths: GSM8K train prompts with our chat template "
        "(SmolLM2's tokenizer, a stand-in for Qwen's). Median of "
        f"{args.micro_batches} micro-batches after 2 warm-ups; peak = torch.cuda.max_memory_allocated.",
        "",
        "| response lengths | tokens / micro-batch: real, padded, flex row | padded s | per-seq sdpa s | flex s "
        "| padded / flex | peak GiB: padded, per-seq sdpa, flex | update per step: padded, flex (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, real, row_len, m in rows:
        (padded_s, padded_gib), (seg_s, seg_gib), (flex_s, flex_gib) = m["padded"], m["per-seq sdpa"], m["flex"]
        lines.append(
            f"| {name} | {real:.0f}, {MICRO * (MAX_PROMPT + MAX_RESPONSE)}, {row_len} | {padded_s:.3f} | {seg_s:.3f} "
            f"| {flex_s:.3f} | {padded_s / flex_s:.2f}x | {padded_gib:.1f}, {seg_gib:.1f}, {flex_gib:.1f} "
            f"| {padded_s * steps_per_update:.1f}, {flex_s * steps_per_update:.1f} |")
    lines += [
        "",
        f"Update per step = {steps_per_update} micro-batches (train_batch_size 32 x 8 rollouts / {MICRO}), "
        "forward + backward only (old log-probs add one forward each).",
        "per-seq sdpa and flex compute remove-padding's row (see the module docstring); flash-attn itself was "
        "not installable on that machine (no package registry).",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
