"""The capability audit's evidence (tests/integration/test_capability_audit.py): per deploy feature, a probe that a
loaded generator's path changed measurably because the feature is on, and the in-thread run of the parallel ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch

from tests.helpers.batched_runs import serve_batched
from tests.helpers.capability_audit import LTX2_VAE, audit_request
from tests.helpers.thread_comm import ThreadComm, run_ranks, thread_group
from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CacheBudgetExceeded
from vidloom.core.request import Task
from vidloom.generator import VideoGenerator
from vidloom.layers.fp8 import FP8Linear
from vidloom.runtime.parallel.comm import RankGroups
from vidloom.runtime.parallel.plan import check_model, check_request
from vidloom.runtime.parallel.worker import rank_engine
from vidloom.text_encoders.elsewhere import EncoderElsewhere


def _components(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    plain = VideoGenerator.from_pretrained(path, device="cpu").engine.run(audit_request(kind))["video"]
    assert not np.array_equal(gen.engine.run(audit_request(kind))["video"], plain), "the override file was not read"


def _modules(gen: VideoGenerator) -> list[torch.nn.Module]:
    return [m for c in gen.engine.instance.components.values() if isinstance(c, torch.nn.Module) for m in c.modules()]


def _first_block_batches(gen: VideoGenerator, kind: str) -> list[int]:
    """The batch of every call into the denoiser's first block during one request."""
    net = gen.engine.instance["transformer"]
    block = next(m for name, m in net.named_modules() if name in ("blocks.0", "double_blocks.0"))
    seen: list[int] = []

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        first = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))  # the residual stream
        seen.append(int(first.shape[0]))

    handle = block.register_forward_pre_hook(record, with_kwargs=True)
    try:
        gen.engine.run(audit_request(kind))
    finally:
        handle.remove()
    return seen


def _kv_budget(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    with pytest.raises(CacheBudgetExceeded):
        gen.engine.run(audit_request(kind))


def _kv_pool(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    plain = VideoGenerator.from_pretrained(path, device="cpu").engine.caches.bytes_in_use
    assert 0 < gen.engine.caches.bytes_in_use < plain  # 64 tokens of pool, not the default 16384


def _kv_session(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    gen.engine.run(audit_request(kind))
    assert gen.engine.caches.session_ids(), "the finished video's KV was not kept"


def _step_cache(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    report = gen.run(audit_request(kind)).metadata["step_cache"]
    assert report["skipped_steps"] > 0, report


# A frame larger than one tile, where the kind's usual request fits in one.
VAE_TILE_REQUESTS: dict[str, dict[str, Any]] = {kind: dict(height=128, width=128) for kind in LTX2_VAE}


def _vae_tile(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    request = dataclasses.replace(audit_request(kind), **VAE_TILE_REQUESTS.get(kind, {}))
    slot = "audio" if request.task == Task.T2A else "video"  # an audio VAE decodes the waveform
    plain = VideoGenerator.from_pretrained(path, device="cpu").engine.run(request)[slot]
    assert not np.array_equal(np.asarray(gen.engine.run(request)[slot]), np.asarray(plain))


def _cfg_batched(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    plain = _first_block_batches(VideoGenerator.from_pretrained(path, device="cpu"), kind)
    batched = _first_block_batches(gen, kind)
    assert set(plain) == {1} and set(batched) == {2}, (plain, batched)  # two forwards of 1 -> one forward of 2


# Where a masked kind's model attention calls SDPA (Cosmos3's Wan VAE calls layers.attention too: a VAE's
# attention is not the backend's).
ATTENTION_MODULE = {"ltx2": "vidloom.layers.attention"}


def _math_attention(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    """Every attention call of the model (its blocks: dense attention, or grouped KV-store attention) ran with SDPA
    held to its math kernel."""
    import importlib

    module = importlib.import_module(ATTENTION_MODULE.get(kind, "vidloom.layers.grouped_attention"))
    seen: list[bool] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(not torch.backends.cuda.flash_sdp_enabled())
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "F", SimpleNamespace(scaled_dot_product_attention=spy))
        gen.engine.run(audit_request(kind))
    assert seen and all(seen), seen


def _batching(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    """Two concurrent requests under the batch policy share their denoise forwards, and neither ran alone."""
    outs, stats = serve_batched(gen.engine, [audit_request(kind, seed) for seed in (3, 4)], batch_wait_s=0.5)
    assert stats["largest_batch"] == 2, stats
    assert all("disabled" not in out.metadata for out in outs), [out.metadata.get("disabled") for out in outs]


PROBES: dict[str, Callable[[VideoGenerator, str, Path, list[int]], None]] = {
    "fp8_weights": lambda gen, *_: _assert(any(isinstance(m, FP8Linear) for m in _modules(gen))),
    "compile": lambda gen, *_: _assert(any(getattr(m, "_compiled_call_impl", None) for m in _modules(gen))),
    "warmup_shapes": lambda gen, kind, path, runs: _assert(len(runs) >= 1),
    "prompt_cache_size": lambda gen, *_: _assert(gen.engine.instance["text_encoder"].cache.capacity == 3),
    "vae_tile": _vae_tile,
    "attention_backend": _math_attention,
    "cfg_mode": _cfg_batched,
    "step_cache": _step_cache,
    "kv_cache_budget_bytes": _kv_budget,
    "kv_pool_tokens": _kv_pool,
    "kv_session_ttl_s": _kv_session,
    "offload_idle_expert": lambda gen, *_: _assert("expert_placement" in gen.engine.instance.components),
    # LTX-2's latent upsampler; SANA-WM's stage-2 refiner.
    "two_stage": lambda gen, *_: _assert(bool({"upsampler", "refiner"} & set(gen.engine.instance.components))),
    "components": _components,
    "batching": _batching,
}


def parallel_in_threads(kind: str, path: Path, deploy: DeployConfig) -> None:
    """The plan's ranks as threads, each with its own copy of the model built as a worker builds it (rank_engine):
    tensors crossed between ranks (sp: the Ulysses exchanges; cfg: the branch predictions) and rank 0's video equals
    one device's."""
    card = registry.resolve_card(path)
    registry.check_deploy(card, deploy)  # the card lets it through
    layout = registry.token_layout(card, path)
    check_model(deploy.parallel, layout)
    request = audit_request(kind)
    check_request(deploy.parallel, layout, request)
    output = "audio" if request.task is Task.T2A else "video"  # Stable Audio's result is a waveform
    single = VideoGenerator.from_pretrained(path, device="cpu").engine.run(request)[output]
    sp, cfg = deploy.parallel.sp, deploy.parallel.cfg
    exchanges: list[str] = []
    # Loaded one after another: model construction (meta-device init) is not thread-safe. Only the encoder's rank
    # (--text-encoder-rank) loads the text encoder, as a worker loads it.
    owner = deploy.parallel.text_encoder_rank
    loaded = deploy if owner is not None else DeployConfig()
    instances = [registry.load_instance(card, path, torch.device("cpu"), None, loaded,
                                        text_encoder_here=owner in (None, rank)) for rank in range(sp * cfg)]

    def rank(comm: ThreadComm) -> np.ndarray:
        counted = _Counted(comm, exchanges)
        groups = RankGroups(sp=counted if sp > 1 else None, cfg=counted if cfg > 1 else None,
                            world=counted if owner is not None else None)
        return np.asarray(rank_engine(instances[comm.rank], layout, groups).run(request)[output])

    videos = run_ranks(thread_group(sp * cfg), rank)
    assert ("all_to_all" in exchanges) == (sp > 1) and "all_gather" in exchanges, set(exchanges)
    if owner is not None:  # the others received the prompt and hold no encoder
        assert "broadcast" in exchanges and isinstance(instances[0]["text_encoder"], EncoderElsewhere)
    assert float(np.abs(videos[0] - np.asarray(single)).max()) <= 1e-5  # fp32; see tests/integration/test_parallel.py


class _Counted:
    """A Comm that records which collectives ran."""

    def __init__(self, comm: ThreadComm, seen: list[str]) -> None:
        self.comm, self.seen, self.rank, self.size = comm, seen, comm.rank, comm.size

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append("all_to_all")
        return self.comm.all_to_all(x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append("all_gather")
        return self.comm.all_gather(x)

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        self.seen.append("broadcast")
        return self.comm.broadcast(x, src)

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.comm.broadcast_object(obj, src)


def _assert(evidence: bool) -> None:
    assert evidence, "the option loaded but left no trace on the path"
