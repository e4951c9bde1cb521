"""Multi-turn rollouts of the CPU stand-in through verl's own agent loop: only the LLM server is stood in.

With `actor_rollout_ref.rollout.multi_turn.enable` (the Search-R1 tool loop), verl 0.9.1 rolls every prompt out in
an `AgentLoopWorker` (verl/experimental/agent_loop/agent_loop.py), which runs the row's `agent_name` loop
(`tool_agent`: `ToolAgentLoop`) against vLLM servers through an `LLMServerClient`. Here the worker, the loop, the
tool parser, the tools it loads from `multi_turn.tool_config_path` (so our `SearchTool` is imported and called on the
node, and asks the retrieval-server at the URL the node's env gives it), the tool-result cut, the chat-template
merging and the padding are all verl's; `CpuServerClient` answers the loop's `generate` with HF `generate` of the
actor's weights, within the token budget verl's vLLM server allows (`vllm_async_server.generate`) and stopping at
the tool parser's stop tokens as vLLM would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput


class CpuServerClient(LLMServerClient):
    """The LLM server of verl's agent loop, stood in by HF generate on the actor's model in this process."""

    def __init__(self, config: Any, model: Any, tokenizer: Any):
        super().__init__(config=config, load_balancer_handle=None)
        self.model = model
        self.tokenizer = tokenizer
        rollout = config.actor_rollout_ref.rollout
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        self.max_model_len = int(rollout.get("max_model_len") or self.prompt_length + self.response_length)
        self.global_steps: int | None = None
        self.requests = 0

    def max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        """vLLM server's budget: max_tokens if asked, else what is left of prompt+response length, capped by the
        response length and the model length (at least 1, as vLLM requires)."""
        possible = self.max_model_len - prompt_len
        if possible < 1:
            raise ValueError(f"Prompt length ({prompt_len}) leaves no room to generate within the model's maximum "
                             f"context length ({self.max_model_len}); need at least 1 token of headroom.")
        asked = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if asked is None:
            asked = min(self.response_length, self.prompt_length + self.response_length - prompt_len)
        return max(1, min(int(asked), possible))

    async def generate(self, request_id, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        self.requests += 1
        stops = set(sampling_params.get("stop_token_ids") or [])
        eos = self.tokenizer.eos_token_id
        if eos is not None and not sampling_params.get("ignore_eos", False):
            stops.add(eos)
        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        ids = torch.tensor([list(prompt_ids)])
        sampling = ({"do_sample": True, "temperature": temperature, "top_p": float(sampling_params.get("top_p", 1.0)),
                     "top_k": top_k if top_k > 0 else 0} if temperature > 0 else {"do_sample": False})
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=self.max_tokens(len(prompt_ids), sampling_params),
                                      eos_token_id=sorted(stops) or None, pad_token_id=pad,
                                      repetition_penalty=float(sampling_params.get("repetition_penalty", 1.0)),
                                      **sampling)
        tokens = out[0, len(prompt_ids):].tolist()
        for i, token in enumerate(tokens):  # vLLM returns the stop token and nothing after it
            if token in stops:
                tokens = tokens[: i + 1]
                break
        return TokenOutput(token_ids=tokens, stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": self.global_steps})


class AgentLoopRollouts:
    """verl's AgentLoopWorker (tools loaded once, as verl's worker does) over the stand-in's server client."""

    def __init__(self, config: Any, model: Any, tokenizer: Any, loop: asyncio.AbstractEventLoop):
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

        self.loop = loop
        self.client = CpuServerClient(config, model, tokenizer)
        asyncio.set_event_loop(loop)  # verl's loops take the current event loop when they are built
        self.worker = AgentLoopWorker(config, self.client)

    @property
    def tool_names(self) -> list[str]:
        return sorted(tool.name for tool in self.worker.tools)

    def rollout(self, batch: dict[str, Any], n: int, global_steps: int) -> dict[str, Any]:
        """n agent-loop rollouts per prompt (interleaved, as verl's `repeat(n, interleave=True)`), as the stand-in's
        rollout dict: prompts and responses cut to their longest row, the response's attention (model tokens and
        tool results) apart from its loss mask (model tokens only), and verl's `__num_turns__`."""
        from verl.protocol import DataProto

        rows = {k: np.repeat(v, n, axis=0) for k, v in batch.items() if isinstance(v, np.ndarray)}
        self.client.global_steps = global_steps
        out = self.loop.run_until_complete(self.worker.generate_sequences(
            DataProto(batch=None, non_tensor_batch=rows, meta_info={"global_steps": global_steps, "validate": False})))
        prompts, responses = out.batch["prompts"], out.batch["responses"]
        width = prompts.shape[1]
        prompt_mask, response_attention = out.batch["attention_mask"][:, :width], out.batch["attention_mask"][:, width:]
        first = int((prompt_mask.sum(dim=0) > 0).nonzero().min()) if prompt_mask.any() else width - 1
        last = int((response_attention.sum(dim=0) > 0).nonzero().max()) + 1 if response_attention.any() else 1
        return {"prompts": prompts[:, first:], "prompt_mask": prompt_mask[:, first:],
                "responses": responses[:, :last], "response_attention": response_attention[:, :last],
                "response_mask": out.batch["response_mask"][:, :last],
                "num_turns": np.asarray(out.non_tensor_batch["__num_turns__"])}
