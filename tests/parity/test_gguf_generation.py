"""GGUF transformers: vidloom (weights kept quantized, dequantized per layer) vs diffusers loading the same file.

Each family's tiny folder is widened so its linears hold whole quant blocks (32 values for Q8_0, 256 for the
K-quants), its transformer written as a GGUF file in the original key layout real GGUF files use (the layout's
fused and swapped tensors included), and loaded on both sides: `from_pretrained(folder, components={"transformer":
file})` here, `from_single_file(file, quantization_config=GGUFQuantizationConfig(compute_dtype=float32))` in
diffusers. Both dequantize to the same float32 weights (ours is bit exact with ggml's reference), so the frames
differ only by what the float32 parity tests already allow.

diffusers (0.42.1) dequantizes in float16 unless told a dtype (its GGUFLinear passes none): each weight is then
rounded to float16 (up to ~8e-4 of a block's range, measured in tests/unit/layers/test_ggml_blocks.py), where
ggml's reference and ours compute in float32. So the reference runs twice: with its dequantizers at float32 (the
same weights as ours: frames and every tap within 1e-4, as the plain float32 parity tests), and as shipped
(frames within FP16_TOLERANCE, the float16 weight rounding carried through the blocks and the VAE).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.flux2_checkpoints import TINY_DISTILLED, write_tiny_flux2
from tests.helpers.gguf_files import transformer_gguf
from tests.helpers.ltx2_checkpoints import TINY_SPLIT, write_tiny_ltx2
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator, build_request
from vidloom.layers.gguf_linear import GGUFLinear, quantized_linears
from vidloom.families.flux2.original_layout import FLUX2_BFL
from vidloom.models.ltx2.original_layout import LTX2_ORIGINAL
from vidloom.models.wan.original_layout import WAN_ORIGINAL
from vidloom.parity import Reference, TapRecorder, run_parity
from vidloom.parity.reference import family_for

# Observed (CPU, float32): <= 1.2e-6 with float32 dequantization on both sides, all three families and both types.
TOLERANCE = 1e-4
# Observed with diffusers' float16 dequantization: 3.3e-4 (FLUX.2 Q8_0) .. 1.6e-3 (Wan Q4_K); one uint8 level is 3.9e-3.
FP16_TOLERANCE = 4e-3
QTYPES = ("Q8_0", "Q4_K")

# Widths of 256 (2 heads x 128) so the K-quants quantize the block linears too.
WAN = dataclasses.replace(TINY_A, name="wan-gguf", transformer={
    **TINY_A.transformer, "attention_head_dim": 128, "ffn_dim": 512, "freq_dim": 256})
FLUX2 = dataclasses.replace(TINY_DISTILLED, name="flux2-gguf", transformer={
    **TINY_DISTILLED.transformer, "attention_head_dim": 128, "axes_dims_rope": (32, 32, 32, 32)})
LTX2 = dataclasses.replace(TINY_SPLIT, name="ltx2-gguf", transformer={
    **TINY_SPLIT.transformer, "attention_head_dim": 128, "audio_attention_head_dim": 32, "audio_cross_attention_dim": 64,
    "cross_attention_dim": 256})


@dataclasses.dataclass(frozen=True)
class Family:
    write: object
    spec: object
    layout: object
    prefix: str
    pipeline: str
    transformer: str
    request: dict


FAMILIES = {
    "wan2.1": Family(write_tiny_wan, WAN, WAN_ORIGINAL, "", "WanPipeline", "WanTransformer3DModel",
                     dict(prompt="a red fox", negative_prompt="blurry", height=32, width=32, num_frames=5,
                          num_inference_steps=2, guidance_scale=5.0, seed=3)),
    "flux2-klein": Family(write_tiny_flux2, FLUX2, FLUX2_BFL, "", "Flux2KleinPipeline", "Flux2Transformer2DModel",
                          dict(prompt="a cat holding a sign", task=Task.T2I, height=32, width=48,
                               num_inference_steps=2, guidance_scale=1.0, seed=11)),
    # A transformer-only file without the `model.diffusion_model.` wrapper, as LTX-2 GGUFs are published.
    "ltx2": Family(write_tiny_ltx2, LTX2, LTX2_ORIGINAL, "", "LTX2Pipeline",
                   "LTX2VideoTransformer3DModel",
                   dict(prompt="a robot dancing", negative_prompt="blurry", height=64, width=64, num_frames=9,
                        fps=25, num_inference_steps=2, guidance_scale=3.0, seed=3)),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request, tmp_path_factory) -> tuple[Family, Path]:
    family = FAMILIES[request.param]
    return family, family.write(tmp_path_factory.mktemp(family.spec.name), family.spec)


def _float32_dequant(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers' GGUF dequantizers computing in float32 (their `dtype` argument), as ggml's reference does."""
    import functools

    from diffusers.quantizers.gguf import utils

    for qtype, fn in list(utils.dequantize_functions.items()):
        monkeypatch.setitem(utils.dequantize_functions, qtype, functools.partial(fn, dtype=torch.float32))


def _reference(family: Family, folder: Path, file: Path) -> Reference:
    import diffusers

    transformer = getattr(diffusers, family.transformer).from_single_file(
        str(file), quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.float32),
        config=str(folder), subfolder="transformer", torch_dtype=torch.float32)
    pipe = getattr(diffusers, family.pipeline).from_pretrained(str(folder), transformer=transformer,
                                                               dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return Reference.wrap(pipe, family_for(folder))


@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_transformer_matches_diffusers(family_dir, qtype, monkeypatch):
    family, folder = family_dir
    file = transformer_gguf(folder, family.layout, qtype, family.prefix)
    generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype=torch.float32,
                                               components={"transformer": file})
    transformer = generator.engine.instance.components["transformer"]
    quantized = quantized_linears(transformer)
    assert len(quantized) >= 8, quantized  # the block linears stayed quantized
    assert {transformer.get_submodule(n).qtype for n in quantized} == {qtype}
    request = GenerationRequest(**family.request)

    with monkeypatch.context() as patch:
        _float32_dequant(patch)  # before loading: diffusers dequantizes its float32-kept modules at load
        reference = _reference(family, folder, file)
        assert any(type(m).__name__ == "GGUFLinear" for m in reference.pipe.transformer.modules())
        exact = run_parity(folder, request, generator=generator, reference=reference)
    report = exact.report.format()
    diff = float(np.abs(exact.ours - exact.theirs).max())
    assert diff <= TOLERANCE, f"{qtype}: max abs diff {diff:.3e}\n{report}"
    assert exact.report.ok, report

    # As shipped, against the same frames of ours (one run of ours serves both references).
    shipped = _reference(family, folder, file).run(exact.request, TapRecorder())
    diff = float(np.abs(exact.ours - shipped).max())
    assert diff <= FP16_TOLERANCE, f"{qtype}, diffusers' float16 dequantization: max abs diff {diff:.3e}"
    assert shipped.std() > 1e-3, "reference output is flat; the test would prove nothing"


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("wan-gguf-lora"), WAN)


def test_runtime_lora_on_a_gguf_transformer_matches_diffusers(wan_dir, tmp_path, monkeypatch):
    """A LoRA on quantized linears: LoRALinear wraps the GGUFLinear (base dequantized per layer, adapter in
    float32), diffusers' PEFT layer wraps its GGUFLinear the same way."""
    from tests.helpers.lora_files import LoRASpec, write_lora

    file = transformer_gguf(wan_dir, WAN_ORIGINAL, "Q4_K")
    lora = write_lora(wan_dir, "WanPipeline", LoRASpec(rank=4, alpha=8, targets=("to_q", "to_v", "ffn.net.0.proj"),
                                                       seed=1), tmp_path)
    _float32_dequant(monkeypatch)
    pipe = _reference(FAMILIES["wan2.1"], wan_dir, file).pipe
    pipe.load_lora_weights(str(lora), adapter_name="style")
    pipe.set_adapters(["style"], adapter_weights=[0.8])
    request = {**FAMILIES["wan2.1"].request, "sampler": "unipc"}  # the pipeline's scheduler
    theirs = pipe(prompt=request["prompt"], negative_prompt=request["negative_prompt"], height=32, width=32,
                  num_frames=5, num_inference_steps=2, guidance_scale=5.0,
                  generator=torch.Generator().manual_seed(3), output_type="np").frames[0]
    generator = VideoGenerator.from_pretrained(wan_dir, device="cpu", dtype=torch.float32,
                                               components={"transformer": file})
    generator.load_lora("style", lora)
    base = generator.engine.run(build_request(generator.card, **request))["video"]
    ours = generator.engine.run(build_request(generator.card, loras={"style": 0.8}, **request))["video"]
    diff = float(np.abs(ours - theirs).max())
    assert diff <= TOLERANCE, f"max abs diff {diff:.3e}"
    assert np.abs(ours - base).max() > 10 / 255, "the adapter barely moves the frames: the test would prove nothing"


def test_gguf_refusals_name_the_file_and_tensor(wan_dir, tmp_path):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import CheckpointError, DeployError

    file = transformer_gguf(wan_dir, WAN_ORIGINAL, "Q8_0")
    with pytest.raises(DeployError, match=r"fp8_weights \(--fp8\) cannot apply to weights loaded from a GGUF file"):
        VideoGenerator.from_pretrained(wan_dir, device="cpu", components={"transformer": file},
                                       deploy=DeployConfig(fp8_weights=True))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(file.read_bytes()[: file.stat().st_size * 2 // 3])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: tensor '[\w.]+' cannot be read .*truncated"):
        VideoGenerator.from_pretrained(wan_dir, device="cpu", components={"transformer": cut})


def test_step_cache_runs_the_same_on_quantized_and_dequantized_weights(wan_dir, tmp_path):
    """fbcache (a step cache keyed on the first block's output) decides and reuses the same way whether the
    linears hold GGUF blocks or the same values dequantized into a plain file."""
    from safetensors.torch import save_file

    from vidloom.core.deploy import DeployConfig
    from vidloom.loading.gguf_file import read_gguf

    file = transformer_gguf(wan_dir, WAN_ORIGINAL, "Q6_K")
    plain = tmp_path / "dequantized.safetensors"
    save_file({k: (v.dequantize() if hasattr(v, "dequantize") else v.float()).contiguous()
               for k, v in read_gguf(file).items()}, str(plain))
    deploy = DeployConfig(step_cache="fbcache", step_cache_threshold=1e9)  # reuse whenever the cache may
    request = {**FAMILIES["wan2.1"].request, "num_inference_steps": 4}
    frames = {}
    for name, path in (("gguf", file), ("plain", plain)):
        gen = VideoGenerator.from_pretrained(wan_dir, device="cpu", dtype=torch.float32,
                                             components={"transformer": path}, deploy=deploy)
        frames[name] = gen.engine.run(build_request(gen.card, **request))["video"]
    assert np.abs(frames["gguf"] - frames["plain"]).max() <= 1e-5
    gen = VideoGenerator.from_pretrained(wan_dir, device="cpu", dtype=torch.float32, components={"transformer": file})
    uncached = gen.engine.run(build_request(gen.card, **request))["video"]
    assert np.abs(frames["gguf"] - uncached).max() > 1e-3, "the cache reused nothing: the test would prove nothing"
