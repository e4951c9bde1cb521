"""rollout-server: samples responses with transformers on CPU and returns each token's behaviour log-prob.

The CPU counterpart of a vLLM/SGLang rollout replica, in the API of the public SkyPilot job-group examples:
`POST /generate` (n samples per prompt with their token ids and log-probs, stamped with the policy version that
produced them), `POST /update_weights` (new weights from a Hugging Face dir on disk, a monotone policy version), `GET
/policy_version`, `GET /health`. A server runs one generation at a time on `--threads` torch threads (more
throughput means more servers behind the router). A weight update waits for the running generation and goes
before the generations queued behind it, so every response's version names the weights of all its outputs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from fastapi import APIRouter, Depends

from verl_grpo.errors import ConfigError
from verl_grpo.services.http import ERROR_RESPONSES, OwnHealth, ServiceError, create_app
from verl_grpo.services.rollout_api import (
    GenerateRequest,
    GenerateResponse,
    PolicyVersion,
    RolloutOutput,
    ServerHealth,
    UpdateWeightsRequest,
    UpdateWeightsResponse,
)
from verl_grpo.services.serving import Serving, serve_command, service_cli

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8500
DEFAULT_MAX_BATCH_SEQUENCES = 64


class PolicyLock:
    """Readers/writer lock for the weights: generations read, a weight update writes.

    At most `max_readers` generations hold it at once; a waiting writer goes before readers that arrive after it.
    """

    def __init__(self, max_readers: int = 1):
        self._cond = threading.Condition()
        self._max_readers = max_readers
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting
                                and self._readers < self._max_readers)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class BehaviourLogprobs:
    """Logits processor that records log softmax(raw logits / T) of each sampled token, then applies T, top-k, top-p.

    It must see the model's raw logits, so the sampler's own temperature/top-k/top-p stay off (the generation
    config sets them neutral). Step t's distribution is kept until step t+1 shows the token drawn from it, so
    memory stays at one [batch, vocab] row per step; `finish` gathers the last step's token.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float):
        from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

        self.temperature = temperature
        self.warpers: list[Any] = []
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))
        self.steps: list[Any] = []
        self._pending: Any = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        self._take(input_ids[:, -1])
        scaled = scores.float() / self.temperature
        self._pending = torch.log_softmax(scaled, dim=-1)
        for warper in self.warpers:
            scaled = warper(input_ids, scaled)
        return scaled

    def _take(self, tokens: Any) -> None:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, tokens.unsqueeze(1)).squeeze(1))
            self._pending = None

    def finish(self, sequences: Any) -> Any:
        """[batch, generated] log-probs of the generated tokens of `sequences`."""
        import torch

        self._take(sequences[:, -1])
        return torch.stack(self.steps, dim=1) if self.steps else sequences.new_zeros((sequences.shape[0], 0),
                                                                                      dtype=torch.float32)


class RolloutEngine:
    """The model, its tokenizer and policy version, behind the readers/writer lock."""

    def __init__(self, model_path: str | Path, policy_version: int = 0, threads: int = 1,
                 max_batch_sequences: int = DEFAULT_MAX_BATCH_SEQUENCES, name: str = ""):
        import torch

        torch.set_num_threads(threads)
        torch.seed()  # separate servers must not draw the same samples for unseeded requests
        self.model, self.tokenizer = _load(model_path)
        self.model_path = str(model_path)
        self.policy_version = policy_version
        self.max_batch_sequences = max_batch_sequences
        self.name = name
        self.lock = PolicyLock()
        self._count_lock = threading.Lock()
        self.in_flight = 0
        self.eos_ids = set(_as_list(self.model.generation_config.eos_token_id))
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)

    @contextmanager
    def counted(self) -> Iterator[None]:
        with self._count_lock:
            self.in_flight += 1
        try:
            yield
        finally:
            with self._count_lock:
                self.in_flight -= 1

    def generate(self, request: GenerateRequest) -> GenerateResponse:
        # As the evaluator encodes prompts: the chat template already placed any special tokens.
        encoded = [list(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in request.prompts]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ServiceError(422, "empty_prompt", f"prompts[{i}] encodes to no tokens; send a non-empty prompt")
            if self.max_positions and len(ids) + request.max_new_tokens > self.max_positions:
                raise ServiceError(422, "too_long", f"prompts[{i}] ({len(ids)} tokens) + max_new_tokens "
                                                    f"{request.max_new_tokens} exceed the model's {self.max_positions} "
                                                    "positions; shorten the prompt or lower max_new_tokens")
        with self.counted(), self.lock.read():
            version = self.policy_version
            outputs = self._sample(encoded, request)
        return GenerateResponse(policy_version=version, worker=self.name, outputs=outputs)

    def _sample(self, encoded: list[list[int]], request: GenerateRequest) -> list[RolloutOutput]:
        import torch

        per_chunk = max(1, self.max_batch_sequences // request.n)
        outputs: list[RolloutOutput] = []
        with torch.random.fork_rng(devices=[], enabled=request.seed is not None):
            if request.seed is not None:
                torch.manual_seed(request.seed)
            for start in range(0, len(encoded), per_chunk):
                outputs += self._sample_chunk(encoded[start:start + per_chunk], start, request)
        return outputs

    def _sample_chunk(self, encoded: list[list[int]], first_index: int,
                      request: GenerateRequest) -> list[RolloutOutput]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        inputs = self.tokenizer.pad({"input_ids": encoded}, return_tensors="pt")
        recorder = BehaviourLogprobs(request.temperature, request.top_k, request.top_p)
        config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=request.max_new_tokens, num_return_sequences=request.n,
                                  pad_token_id=self.tokenizer.pad_token_id,
                                  eos_token_id=self.model.generation_config.eos_token_id)
        with torch.inference_mode():
            sequences = self.model.generate(**inputs, generation_config=config,
                                            logits_processor=LogitsProcessorList([recorder]))
            generated = sequences[:, inputs["input_ids"].shape[1]:]
            logprobs = recorder.finish(sequences).tolist()
        outputs = []
        for row, ids in enumerate(generated.tolist()):
            prompt = row // request.n
            end = next((i + 1 for i, t in enumerate(ids) if t in self.eos_ids), None)
            kept = ids if end is None else ids[:end]
            outputs.append(RolloutOutput(
                prompt_index=first_index + prompt, text=self.tokenizer.decode(kept, skip_special_tokens=True),
                prompt_token_ids=encoded[prompt], token_ids=kept, logprobs=logprobs[row][:len(kept)],
                finish_reason="stop" if end is not None else "length"))
        return outputs

    def update_weights(self, request: UpdateWeightsRequest) -> UpdateWeightsResponse:
        started = time.perf_counter()
        self._check_version(request.policy_version)
        state = _read_safetensors(request.path)
        self._check_keys(state, request.path)
        with self.lock.write():
            self._check_version(request.policy_version)
            import torch

            with torch.no_grad():
                self.model.load_state_dict(state, strict=False)
            self.policy_version = request.policy_version
            self.model_path = request.path
        seconds = round(time.perf_counter() - started, 6)
        logger.info("policy version %d loaded from %s in %.3fs", request.policy_version, request.path, seconds)
        return UpdateWeightsResponse(policy_version=request.policy_version, seconds=seconds)

    def _check_version(self, version: int) -> None:
        if version < self.policy_version:
            raise ServiceError(409, "stale_policy_version",
                               f"policy_version {version} is lower than the served {self.policy_version}; "
                               "push a version at least as new")

    def _check_keys(self, state: dict[str, Any], path: str) -> None:
        own = self.model.state_dict()
        unexpected = sorted(set(state) - set(own))
        missing = sorted(k for k in set(own) - set(state) if not _tied_to_present(k, own, state))
        wrong_shape = sorted(k for k in set(state) & set(own) if tuple(state[k].shape) != tuple(own[k].shape))
        problems = [f"{label}: {', '.join(keys[:5])}" for label, keys in
                    (("unexpected", unexpected), ("missing", missing), ("shape differs", wrong_shape)) if keys]
        if problems:
            raise ServiceError(400, "incompatible_weights", f"weights in {path} do not fit the served model "
                                                            f"({'; '.join(problems)}); save the same architecture")

    def health(self, uptime_s: float) -> ServerHealth:
        return ServerHealth(policy_version=self.policy_version, model_path=self.model_path,
                            in_flight=self.in_flight, uptime_s=uptime_s)


def _tied_to_present(key: str, own: dict[str, Any], state: dict[str, Any]) -> bool:
    """A parameter sharing storage with one the file provides (tied embeddings are saved once)."""
    ptr = own[key].data_ptr()
    return any(other in state and own[other].data_ptr() == ptr for other in own if other != key)


def _read_safetensors(path: str) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        raise ServiceError(400, "unreadable_weights", f"path {path} holds no *.safetensors files; pass the Hugging "
                                                      "Face model dir the trainer saved")
    state: dict[str, Any] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (OSError, SafetensorError) as e:
            raise ServiceError(400, "unreadable_weights", f"{file} cannot be read ({e}); write it again") from None
    return state


def _load(model_path: str | Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path), padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model {model_path} could not be loaded ({type(e).__name__}: {e}); pass a Hugging Face "
                          "model directory") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    # Only the end and pad tokens of the model's own defaults: its sampling defaults would be merged into ours.
    model.generation_config = GenerationConfig(eos_token_id=eos if eos is not None else tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=model.generation_config.bos_token_id)
    model.eval()
    return model, tokenizer


def _as_list(value: int | Sequence[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def build_app(engine: RolloutEngine, token: str | None, max_body_bytes: int):
    # Generations waiting for the model may fill the thread pool: the router's health checks must still be answered.
    app, auth = create_app("rollout-server", token, max_body_bytes,
                           description="Samples rollouts with their behaviour log-probs; loads new weights from disk.",
                           own_health=OwnHealth(ServerHealth, engine.health))
    router = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @router.get("/policy_version", response_model=PolicyVersion)
    async def policy_version() -> PolicyVersion:
        return PolicyVersion(policy_version=engine.policy_version, model_path=engine.model_path)

    @router.post("/generate", response_model=GenerateResponse)
    def generate(request: GenerateRequest) -> GenerateResponse:
        """n samples per prompt, grouped by prompt in request order, with the policy version of all of them."""
        return engine.generate(request)

    @router.post("/update_weights", response_model=UpdateWeightsResponse)
    def update_weights(request: UpdateWeightsRequest) -> UpdateWeightsResponse:
        """Load the weights of an HF dir in place once the running generation ends; 409 for an older version."""
        return engine.update_weights(request)

    app.include_router(router)
    return app


cli = service_cli("rollout-server: CPU sampling with transformers behind the rollout API of SkyPilot's job-group "
                  "examples.")


@serve_command(cli, DEFAULT_PORT,
               click.option("--model", "model_path", required=True, type=click.Path(exists=True, file_okay=False),
                            help="Hugging Face model directory to serve."),
               click.option("--policy-version", type=click.IntRange(min=0), default=0, show_default=True,
                            help="Version of the weights in --model."),
               click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
                            help="torch threads."),
               click.option("--max-batch-sequences", type=click.IntRange(min=1), default=DEFAULT_MAX_BATCH_SEQUENCES,
                            show_default=True, help="Sequences (prompts x n) sampled together in one batch."))
def serve(serving: Serving, model_path, policy_version, threads, max_batch_sequences) -> None:
    engine = RolloutEngine(model_path, policy_version, threads, max_batch_sequences, name=serving.url)
    serving.run(build_app(engine, serving.token, serving.max_body_bytes))


if __name__ == "__main__":
    cli()
