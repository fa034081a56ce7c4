"""A tiny randomly initialized Llama and a byte tokenizer, so engine tests need no weights."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.sequence import Request

EOS_IDS = (2, 1)  # two end-of-sequence ids; the tokenizer knows only the first
VOCAB = 64


class ByteTokenizer:
    """Maps each UTF-8 byte b to id 3 + b % 61; ids 0 (pad), 1 and 2 (EOS) are special."""

    pad_token_id = 0
    eos_token_id = EOS_IDS[0]

    def encode(self, text: str) -> list[int]:
        return [3 + b % (VOCAB - 3) for b in text.encode("utf-8")]

    def __call__(self, text: str, add_special_tokens: bool = True, **kwargs) -> dict:
        return {"input_ids": self.encode(text)}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True) -> list[int]:
        """A stand-in template: a marker byte, the user text, a marker byte."""
        return [3] + self.encode(messages[-1]["content"]) + [4]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        keep = [i for i in ids if not (skip_special_tokens and i < 3)]
        return " ".join(str(i) for i in keep)


def tiny_model(seed: int = 0, num_layers: int = 2):
    """A 2-layer Llama with grouped-query attention (4 heads, 2 KV heads), fp32, on CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=list(EOS_IDS),
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def tiny_runner(seed: int = 5) -> ModelRunner:
    """A ``ModelRunner`` over ``tiny_model`` with the byte tokenizer."""
    return runner_of(tiny_model(seed), "tiny-llama")


def runner_of(model, name: str) -> ModelRunner:
    """A ``ModelRunner`` over a float32 CPU ``model`` with the byte tokenizer, loaded in memory
    (no ``source``: its kernels are not timed)."""
    loaded = SimpleNamespace(
        model=model,
        tokenizer=ByteTokenizer(),
        name=name,
        device=torch.device("cpu"),
        dtype=torch.float32,
        eos_token_ids=list(EOS_IDS),
        max_context=512,
        device_label="CPU · float32",
        load_s=0.0,
    )
    return ModelRunner(loaded)


def make_requests(specs: list[tuple[str, int]]) -> list[Request]:
    """(prompt, cap) pairs -> tokenized requests with ids 0..n-1."""
    tok = ByteTokenizer()
    return [Request(i, p, cap, tuple(tok.encode(p))) for i, (p, cap) in enumerate(specs)]


def tiny_shared(spec=None):
    """The page's model of a warmed-up ``tiny_worker_model``, on the engine thread."""
    from engine.page.run.shared_model import local_model

    return local_model(tiny_worker_model(spec))


def tiny_worker_model(spec=None):
    """A warmed-up ``WorkerModel`` over ``tiny_runner()``: the
    engine process's loader in tests (``ModelSpec(load=tiny_worker_model)``).
    ``spec.model == "slow"`` makes each forward pass take ``SLOW_STEP_S`` more, so a run lasts
    long enough to watch, stop or kill."""
    import time

    from engine.fidelity.reference import ReferenceCache
    from engine.worker.worker_model import WorkerModel

    runner = tiny_runner()
    if spec is not None and spec.model == "slow":
        forward = runner.forward_packed

        def slow_forward(batch):
            time.sleep(SLOW_STEP_S)
            return forward(batch)

        runner.forward_packed = slow_forward
    held = WorkerModel(runner.loaded, runner, ReferenceCache(runner))
    held.warm_up()
    return held


SLOW_STEP_S = 0.02  # tiny_shared's slowed forward pass


def tiny_process_worker(model: str = "tiny"):
    """A started engine process on ``tiny_worker_model`` (``model``: "tiny", or "slow" for the
    slowed forward pass), yielded, then ended: the body of a module fixture."""
    from engine.worker.worker_process import ModelSpec, ProcessWorker

    worker = ProcessWorker(ModelSpec(model=model, load=tiny_worker_model))
    worker.start()
    try:
        yield worker
    finally:
        worker.close()


def worker_modules(_model, _watch) -> list[str]:
    """An engine-process job (tests): the names of the modules loaded where it runs."""
    import sys

    return sorted(sys.modules)


def step_logits(runner, config: EngineConfig, specs: list[tuple[str, int]]) -> list[torch.Tensor]:
    """Every step's logits ``[1, S, V]`` in a continuous engine run of ``specs`` under
    ``config``: the output embedding's outputs, captured by a forward hook."""
    caught = []
    head = runner.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, out: caught.append(out.detach().clone()))
    try:
        ContinuousEngine(runner, config).run(make_requests(specs))
    finally:
        handle.remove()
    return caught
