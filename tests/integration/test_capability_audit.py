"""Every deploy feature x every kind of checkpoint: honoured where the card declares it, refused by name elsewhere.

For each kind (a column of `vidloom models --capabilities`) a tiny checkpoint is written and its card built:
- the card declares exactly that column (so the printed matrix is what loads see);
- each feature it does not declare, switched on, fails at load with a DeployError naming feature and family, and the
  card gives its reason (a server policy, batching, is not refused at load: the run says it ran alone);
- each feature it declares, switched on, loads (or fails only for this machine, naming CUDA) and leaves evidence
  that it acted: the path changed measurably. A card that claims a feature its load refuses fails here, and
  so does an option a load accepts and ignores.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch

from tests.helpers.adapter_checkpoints import write_tiny_pipeline
from tests.helpers.batched_runs import serve_batched
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.helios_checkpoints import TINY_A as HELIOS_A, write_tiny_helios
from tests.helpers.flux2_checkpoints import TINY_BASE, TINY_DISTILLED, write_tiny_flux2
from tests.helpers.hunyuan15_checkpoints import write_pipeline as write_hunyuan15
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from tests.helpers.qwen3_omni_checkpoints import THINKER_A, write_tiny_thinker
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_refiner, write_tiny_sana_wm
from tests.helpers.wan_i2v_checkpoints import make_image
from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio
from tests.helpers.thread_comm import ThreadComm, run_ranks, thread_group
from tests.helpers.wan22_checkpoints import write_tiny_a14b
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from tests.helpers.cosmos3_action_checkpoints import write_tiny_cosmos3_action
from vidloom import registry
from vidloom.cli.capabilities import capability_rows
from vidloom.core.capabilities import FEATURES
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CacheBudgetExceeded, DeployError, InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.layers.fp8 import FP8Linear
from vidloom.runtime.engine import EngineDriver
from vidloom.runtime.parallel.comm import RankGroups
from vidloom.runtime.parallel.plan import check_model, check_request
from vidloom.runtime.parallel.worker import rank_engine
from vidloom.text_encoders.elsewhere import EncoderElsewhere


def _with_refiner(folder: Path) -> Path:
    write_tiny_refiner(folder, SANA_WM_A)  # two_stage reads <folder>/refiner/
    return folder


def _chat_only(folder: Path) -> Path:
    write_tiny_cosmos3(folder, COSMOS3_A)
    index = json.loads((folder / "model_index.json").read_text())
    for name in ("vae", "scheduler"):
        shutil.rmtree(folder / name)
        index[name] = [None, None]  # diffusers' record of an absent optional component
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


# Column label -> writer of a tiny checkpoint of that kind.
WRITERS: dict[str, Callable[[Path], Path]] = {
    "wan": lambda d: write_tiny_wan(d, TINY_A),
    "wan2.2-a14b": lambda d: write_tiny_a14b(d, TINY_A),
    "anyflow-far": lambda d: write_tiny_far(d, FAR_A),
    "flux2": lambda d: write_tiny_flux2(d, TINY_BASE),
    "flux2-distilled": lambda d: write_tiny_flux2(d, TINY_DISTILLED),
    "ltx2": lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0], upsampler=True),
    "cosmos3": lambda d: write_tiny_cosmos3(d, COSMOS3_A),
    "cosmos3-actions": lambda d: write_tiny_cosmos3_action(d),  # kv_session_ttl_s acts: test_cosmos3_action_session
    "cosmos3-chat-only": _chat_only,
    # Its one feature (attention_backend, diffusers' dispatcher) is checked in tests/integration/test_adapter_server.py.
    "adapted diffusers pipeline": lambda d: write_tiny_pipeline(d, "cogvideox"),
    "qwen-omni": lambda d: write_tiny_omni(d, OMNI_A),
    "qwen3-omni": lambda d: write_tiny_thinker(d, THINKER_A),
    "qwen-image": write_qwen_image_wide,  # three blocks: a step cache has blocks to skip
    "hunyuan15": lambda d: write_hunyuan15(d, "p1") and d,
    "sana-wm": lambda d: _with_refiner(write_tiny_sana_wm(d, SANA_WM_A)),
    "stable-audio": lambda d: write_tiny_stable_audio(d, TINY_STEREO),
    "helios": lambda d: write_tiny_helios(d, HELIOS_A),
}
# A small request each kind runs (guidance on, so CFG has two branches); its size is also the warmup shape.
REQUESTS: dict[str, dict[str, Any]] = {
    "wan": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "wan2.2-a14b": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "anyflow-far": dict(height=32, width=48, num_frames=9, num_inference_steps=2, guidance_scale=3.0),
    "flux2": dict(task=Task.T2I, height=32, width=48, num_frames=1, num_inference_steps=2, guidance_scale=4.0),
    "ltx2": dict(height=64, width=64, num_frames=9, fps=25, num_inference_steps=2, guidance_scale=3.0),
    "qwen-image": dict(task=Task.T2I, height=32, width=48, num_frames=1, num_inference_steps=2, guidance_scale=4.0),
    "hunyuan15": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "cosmos3": dict(height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=3.0, fps=16),
    "stable-audio": dict(task=Task.T2A, seconds=0.5, num_inference_steps=2, guidance_scale=7.0),
    "helios": dict(height=32, width=48, num_frames=33, num_inference_steps=2, guidance_scale=5.0),  # one chunk
    "sana-wm": dict(height=64, width=96, num_frames=17, camera="jw-16", image=make_image(70, 40, 1),
                    intrinsics=[50.0, 52.0, 35.0, 20.0], num_inference_steps=2, guidance_scale=3.0),
}
# A non-default value per feature (one that runs on these tiny checkpoints).
ENABLE: dict[str, Callable[[str], dict[str, Any]]] = {
    "fp8_weights": lambda kind: dict(fp8_weights=True),
    "compile": lambda kind: dict(compile=True, compile_backend="eager"),
    "warmup_shapes": lambda kind: dict(warmup_shapes=(_shape(kind),)),
    "offload_text_encoder": lambda kind: dict(offload_text_encoder=True),
    "prompt_cache_size": lambda kind: dict(prompt_cache_size=3),
    # LTX-2's VAE is 32x (SANA-WM decodes with it): tiles of 3 latent cells every 2 on a 4x4 latent
    # (VAE_TILE_REQUESTS), no 1-cell edge tile.
    "vae_tile": lambda kind: dict(vae_tile=96, vae_tile_stride=64) if kind in LTX2_VAE else dict(vae_tile=32,
                                                                                                 vae_tile_stride=16),
    # Kinds that mask every attention call refuse flash/sage by that reason (test_decoder_acceleration.py): they
    # take the math kernel, which runs here.
    "attention_backend": lambda kind: dict(attention_backend="math" if kind in MASKED_ATTENTION else "flash"),
    "cfg_mode": lambda kind: dict(cfg_mode="batched"),
    # A DBCache preset with TaylorSeer (fbcache is its F1B0 case): every block past the first reused after step 0.
    "step_cache": lambda kind: dict(step_cache="fast", step_cache_warmup=1, step_cache_threshold=1e9),
    "cuda_graphs": lambda kind: dict(cuda_graphs=True),
    "kv_cache_budget_bytes": lambda kind: dict(kv_cache_budget_bytes=1024),
    "kv_pool_tokens": lambda kind: dict(kv_pool_tokens=64),
    "kv_session_ttl_s": lambda kind: dict(kv_session_ttl_s=60.0),
    "offload_idle_expert": lambda kind: dict(offload_idle_expert=True),
    "two_stage": lambda kind: dict(two_stage=True),
    "devices": lambda kind: dict(devices=SP.get(kind, 2), parallel=ParallelPlan(sp=SP.get(kind, 2))),
    "cfg_parallel": lambda kind: dict(devices=2, parallel=ParallelPlan(cfg=2)),
    # Rank 1 holds the encoder: rank 0, whose video is compared, receives the encoded prompt.
    "text_encoder_rank": lambda kind: dict(devices=SP.get(kind, 2),
                                           parallel=ParallelPlan(sp=SP.get(kind, 2), text_encoder_rank=1)),
    # The folder's transformer with its weights scaled (written by the `folders` fixture); a kind that refuses the
    # feature never reaches the file.
    "components": lambda kind: dict(
        components={"transformer": str(COMPONENT_FILES.get(kind, "transformer.safetensors"))}),
    "batching": lambda kind: {},  # a server policy (--policy batch), no deploy field: _batching serves two requests
}
# kind -> a transformer file for `components`, next to that kind's tiny folder.
COMPONENT_FILES: dict[str, Path] = {}
# Honoured, but nothing on this machine can observe it; where it is tested instead.
NOT_OBSERVABLE_HERE = {
    "offload_text_encoder": "on CPU the encoder already lives in host memory (tests/gpu move it to the device)",
}
# A pool starts one process per rank; here its ranks are threads sharing a tensor exchange (tests/helpers/thread_comm),
# each running rank_engine as a worker does (tests/integration/test_parallel*.py start real processes).
IN_THREADS = ("devices", "cfg_parallel", "text_encoder_rank")
SP = {"flux2": 3, "qwen-image": 3}  # sequence-parallel degree: the tiny checkpoints' head counts
CUDA_ONLY = ("attention_backend", "cuda_graphs")  # refused on CPU by the kernel itself, naming CUDA
LTX2_VAE = frozenset({"ltx2", "sana-wm"})
MASKED_ATTENTION = frozenset({"ltx2", "cosmos3", "cosmos3-actions", "cosmos3-chat-only", "qwen-omni", "qwen3-omni"})


def _shape(kind: str) -> tuple[int, int, int]:
    request = REQUESTS[kind] if "height" in REQUESTS.get(kind, {}) else REQUESTS["wan"]  # audio kinds: no frames
    return request["height"], request["width"], request["num_frames"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Callable[[str], Path]:
    written: dict[str, Path] = {}

    def folder(kind: str) -> Path:
        if kind not in written:
            written[kind] = WRITERS[kind](tmp_path_factory.mktemp(kind) / kind)
            COMPONENT_FILES[kind] = _scaled_transformer(written[kind])
        return written[kind]

    return folder


def test_every_column_has_a_checkpoint_here():
    assert set(WRITERS) == set(capability_rows()), "a new capability column needs a tiny checkpoint in WRITERS"
    assert set(ENABLE) == set(FEATURES), "a new feature needs a value in ENABLE"


@pytest.mark.parametrize("kind", list(WRITERS))
def test_the_card_declares_its_column_and_its_load_refuses_the_rest(kind, folders):
    path = folders(kind)
    card = registry.resolve_card(path)
    assert card.capabilities == capability_rows()[kind]
    for feature in FEATURES:
        if feature in card.capabilities.supported:
            continue
        assert feature in card.capabilities.why_not, f"{kind} refuses {feature} without a reason"
        if not FEATURES[feature].fields:
            continue  # nothing to refuse at load (tests/integration/test_turned_off_features.py: it runs alone)
        deploy = DeployConfig(**ENABLE[feature](kind))
        with pytest.raises(DeployError) as err:
            registry.load_instance(card, path, torch.device("cpu"), None, deploy)
        # --cfg-parallel needs --devices 2, which a family refusing both names first.
        assert f"({card.family}) does not support " in str(err.value), str(err.value)
        assert f"{feature} ({', '.join(FEATURES[feature].flags)}): " in str(err.value), str(err.value)


# (kind, feature) for every declared feature; the Wan variants only where they differ from "wan".
HONOURED = sorted(
    {(kind, feature) for kind, caps in capability_rows().items() for feature in caps.supported
     if kind in REQUESTS and (kind == "wan" or not kind.startswith("wan") or
                              feature not in capability_rows()["wan"].supported)}
)


@pytest.mark.parametrize(("kind", "feature"), HONOURED, ids=[f"{k}-{f}" for k, f in HONOURED])
def test_a_declared_feature_loads_and_acts(kind, feature, folders, monkeypatch):
    path = folders(kind)
    deploy = DeployConfig(**ENABLE[feature](kind))
    if feature in NOT_OBSERVABLE_HERE:
        VideoGenerator.from_pretrained(path, device="cpu", deploy=deploy)
        return
    if feature in IN_THREADS:
        _parallel_in_threads(kind, path, deploy)
        return
    runs: list[int] = []
    real_run = EngineDriver.run
    monkeypatch.setattr(EngineDriver, "run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    try:
        gen = VideoGenerator.from_pretrained(path, device="cpu", deploy=deploy)
    except DeployError as exc:
        message = str(exc)
        assert "does not support" not in message, f"{kind} declares {feature} but its load refuses it: {message}"
        if feature in CUDA_ONLY:
            assert "CUDA" in message
            return
        assert feature == "kv_cache_budget_bytes" and "--kv-cache-budget-mb" in message, message
        return  # the budget bounded what the load allocated (the chat KV pool)
    monkeypatch.undo()
    assert feature not in CUDA_ONLY or kind in MASKED_ATTENTION, f"{feature} loaded on CPU"
    PROBES[feature](gen, kind, path, runs)


def _scaled_transformer(folder: Path) -> Path:
    """The folder's transformer weights times 0.9 as one diffusers-layout file beside the folder."""
    from safetensors.torch import load_file, save_file

    source = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    if not source.is_file():  # a sharded or transformer-less folder: its kinds do not declare `components`
        return folder.parent / "transformer.safetensors"
    scaled = {key: t * 0.9 if t.is_floating_point() else t for key, t in load_file(str(source)).items()}
    save_file(scaled, str(folder.parent / "transformer.safetensors"))
    return folder.parent / "transformer.safetensors"


def _components(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    plain = VideoGenerator.from_pretrained(path, device="cpu").engine.run(_request(kind))["video"]
    assert not np.array_equal(gen.engine.run(_request(kind))["video"], plain), "the override file was not read"


def _request(kind: str, seed: int = 3) -> GenerationRequest:
    return GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=seed, **REQUESTS[kind])


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
        gen.engine.run(_request(kind))
    finally:
        handle.remove()
    return seen


def _kv_budget(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    with pytest.raises(CacheBudgetExceeded):
        gen.engine.run(_request(kind))


def _kv_pool(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    plain = VideoGenerator.from_pretrained(path, device="cpu").engine.caches.bytes_in_use
    assert 0 < gen.engine.caches.bytes_in_use < plain  # 64 tokens of pool, not the default 16384


def _kv_session(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    gen.engine.run(_request(kind))
    assert gen.engine.caches.session_ids(), "the finished video's KV was not kept"


def _step_cache(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    report = gen.run(_request(kind)).metadata["step_cache"]
    assert report["skipped_steps"] > 0, report


# A frame larger than one tile, where the kind's usual request fits in one.
VAE_TILE_REQUESTS: dict[str, dict[str, Any]] = {kind: dict(height=128, width=128) for kind in LTX2_VAE}


def _vae_tile(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    request = dataclasses.replace(_request(kind), **VAE_TILE_REQUESTS.get(kind, {}))
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
        gen.engine.run(_request(kind))
    assert seen and all(seen), seen


def _batching(gen: VideoGenerator, kind: str, path: Path, runs: list[int]) -> None:
    """Two concurrent requests under the batch policy share their denoise forwards, and neither ran alone."""
    outs, stats = serve_batched(gen.engine, [_request(kind, seed) for seed in (3, 4)], batch_wait_s=0.5)
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


def _parallel_in_threads(kind: str, path: Path, deploy: DeployConfig) -> None:
    """The plan's ranks as threads, each with its own copy of the model built as a worker builds it (rank_engine):
    tensors crossed between ranks (sp: the Ulysses exchanges; cfg: the branch predictions) and rank 0's video equals
    one device's."""
    card = registry.resolve_card(path)
    registry.check_deploy(card, deploy)  # the card lets it through
    layout = registry.token_layout(card, path)
    check_model(deploy.parallel, layout)
    request = _request(kind)
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


# The `lora` row (Family.lora; not a deploy feature): a declaring kind takes an adapter on its denoiser's output
# linear, named as its checkpoint names it, and the adapter moves the output; every other kind refuses by name.
@pytest.mark.parametrize("kind", [kind for kind in WRITERS if kind in REQUESTS])
def test_the_lora_row_is_what_loading_an_adapter_does(kind, folders, tmp_path):
    from vidloom.lora.registry import check_family

    gen = VideoGenerator.from_pretrained(folders(kind), device="cpu")
    owner = next(f for f in registry.families() if gen.card.family in f.card_families)
    if owner.lora is None:
        with pytest.raises(InvalidRequest, match=f"not supported for the '{gen.card.family}' family"):
            gen.load_lora("audit", tmp_path / "absent.safetensors")
        return
    check_family(gen.card.family)
    # The last linear the run calls among every target component (Cosmos3's chat backbone runs the prompt prefill
    # first, its generator the steps after it), keyed under the file prefix that component reads.
    calls: list[tuple[str, str]] = []
    hooks = [m.register_forward_hook(lambda *_, at=(component, name): calls.append(at))
             for component, _ in owner.lora.targets if component in gen.engine.instance.components
             for name, m in gen.engine.instance[component].named_modules() if isinstance(m, torch.nn.Linear)]
    request = _request(kind)
    output = "audio" if request.task is Task.T2A else "video"  # Stable Audio's result is a waveform
    plain = gen.engine.run(request)[output]
    for hook in hooks:
        hook.remove()
    component, module = calls[-1]
    key = owner.resolve(dict(owner.lora.targets)[component]).to_checkpoint(module)
    gen.load_lora("audit", _adapter_file(gen, component, owner.lora.reads.get(component, component), key, module,
                                         tmp_path))
    adapted = gen.engine.run(dataclasses.replace(request, loras=(("audit", 1.0),)))[output]
    assert np.abs(np.asarray(adapted, np.float32) - np.asarray(plain, np.float32)).max() > 1e-3, "the adapter did nothing"


def _adapter_file(gen: VideoGenerator, component: str, prefix: str, key: str, module: str, folder: Path) -> Path:
    """A rank-2 PEFT file (diffusers' `<prefix>.<module>.lora_A/B.weight` keys) on one linear of `component`."""
    from safetensors.torch import save_file

    linear = gen.engine.instance[component].get_submodule(module)
    g = torch.Generator().manual_seed(0)
    path = folder / "audit.safetensors"
    save_file({f"{prefix}.{key}.lora_A.weight": torch.randn(2, linear.in_features, generator=g),
               f"{prefix}.{key}.lora_B.weight": torch.randn(linear.out_features, 2, generator=g)}, str(path))
    return path
