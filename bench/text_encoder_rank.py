"""--text-encoder-rank: the weight bytes each rank holds, measured on a demo pool and counted for real checkpoints.

Measured: wan2.1-demo and ltx2-demo on two gloo ranks (--sp 2), replicated and with the encoder on rank 1: every
rank's held weight bytes (ParallelEngine.weight_bytes: parameters, buffers and sharded slices of every component).
Counted: each published checkpoint's text encoder(s) and denoiser(s), built on the meta device from their config
files (tests/fixtures/published: transformers' classes for the encoders, the ones vidloom loads; diffusers' for the
denoisers and for SANA-WM's refiner connectors), at bfloat16 (2 bytes a parameter, shared weights once). A receiving
rank holds the denoiser(s) and the VAE, not the encoder; LTX-2's text connectors stay on every rank (a LoRA target),
so they are not counted as its encoder, while SANA-WM's refiner connectors go with the refiner's Gemma 3. Results:
bench/results/text-encoder-rank.json (with the load average).

    python bench/text_encoder_rank.py [--no-demo]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PUBLISHED = ROOT / "tests" / "fixtures" / "published"
GIB = 2**30
# checkpoint folder -> ((encoder folder, class), ...), ((denoiser folder, diffusers class), ...); an encoder's class
# is transformers' unless it names its module ("module:Class", a diffusers config class).
Parts = tuple[tuple[str, str], ...]
CHECKPOINTS: dict[str, tuple[Parts, Parts]] = {
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": ((("text_encoder", "UMT5EncoderModel"),),
                                         (("transformer", "WanTransformer3DModel"),)),
    "Wan-AI/Wan2.1-T2V-14B-Diffusers": ((("text_encoder", "UMT5EncoderModel"),),
                                        (("transformer", "WanTransformer3DModel"),)),
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": ((("text_encoder", "UMT5EncoderModel"),),
                                        (("transformer", "WanTransformer3DModel"),)),
    "black-forest-labs/FLUX.2-klein-4B": ((("text_encoder", "Qwen3ForCausalLM"),),
                                          (("transformer", "Flux2Transformer2DModel"),)),
    "black-forest-labs/FLUX.2-klein-9B": ((("text_encoder", "Qwen3ForCausalLM"),),
                                          (("transformer", "Flux2Transformer2DModel"),)),
    "Qwen/Qwen-Image": ((("text_encoder", "Qwen2_5_VLForConditionalGeneration"),),
                        (("transformer", "QwenImageTransformer2DModel"),)),
    "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v": (
        (("text_encoder", "Qwen2_5_VLTextModel"), ("text_encoder_2", "T5EncoderModel")),
        (("transformer", "HunyuanVideo15Transformer3DModel"),)),
    "Lightricks/LTX-2": ((("text_encoder", "Gemma3ForConditionalGeneration"),),
                         (("transformer", "LTX2VideoTransformer3DModel"),)),
    # AutoModel reads the Gemma-2 folder as Gemma2Model (text.py); the refiner's DiT is LTX-2's (--two-stage).
    "Efficient-Large-Model/SANA-WM_bidirectional-diffusers": (
        (("text_encoder", "Gemma2Model"), ("refiner/text_encoder", "Gemma3ForConditionalGeneration"),
         ("refiner/connectors", "diffusers.pipelines.ltx2.connectors:LTX2TextConnectors")),
        (("transformer", "SanaWMTransformer3DModel"), ("refiner/transformer", "LTX2VideoTransformer3DModel"))),
}


def _count(module: torch.nn.Module) -> int:
    """Parameters and buffers, each storage once (tied embeddings)."""
    tensors = {id(t): t.numel() for t in (*module.parameters(), *module.buffers())}
    return sum(tensors.values())


def _encoder_params(folder: Path, class_name: str) -> int:
    import transformers

    if ":" in class_name:  # a diffusers config class in its own module
        return _config_params(folder, class_name)
    config = transformers.AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        return _count(getattr(transformers, class_name)(config))


def _config_params(folder: Path, class_name: str) -> int:
    """A diffusers class ("Name" at the top level, or "module:Name") built from its config on the meta device."""
    import importlib

    module, _, name = class_name.rpartition(":")
    cls = getattr(importlib.import_module(module or "diffusers"), name)
    with torch.device("meta"):
        return _count(cls.from_config(cls.load_config(str(folder))))


def published() -> list[dict[str, Any]]:
    rows = []
    for name, (encoders, denoisers) in CHECKPOINTS.items():
        root = PUBLISHED / name
        encoder = sum(_encoder_params(root / sub, cls) for sub, cls in encoders) * 2
        denoiser = sum(_config_params(root / sub, cls) for sub, cls in denoisers) * 2
        rows.append({"checkpoint": name, "text_encoder_bytes": encoder, "denoiser_bytes": denoiser,
                     "encoder_share_of_replicated": round(encoder / (encoder + denoiser), 3)})
    return rows


DEMOS = ("wan2.1-demo", "ltx2-demo")


def demo() -> dict[str, dict[str, list[int]]]:
    """Each demo's per-rank weight bytes, replicated and with the encoder on rank 1."""
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.parallel import ParallelPlan
    from vidloom.generator import VideoGenerator

    held: dict[str, dict[str, list[int]]] = {}
    cache = Path(tempfile.mkdtemp(prefix="vidloom-demo-"))
    for model in DEMOS:
        for label, owner in (("replicated", None), ("encoder_on_rank_1", 1)):
            deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2, text_encoder_rank=owner))
            with VideoGenerator.from_pretrained(model, device="cpu", cache_dir=cache, deploy=deploy) as gen:
                held.setdefault(model, {})[label] = gen.engine.weight_bytes()
    return held


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-demo", action="store_true", help="skip the two demo pools")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "text-encoder-rank.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"load_average": os.getloadavg(), "published_bf16": published()}
    if not args.no_demo:
        result["demo_sp2_weight_bytes"] = demo()
    for row in result["published_bf16"]:
        print(f"{row['checkpoint']:62s} encoder {row['text_encoder_bytes'] / GIB:6.2f} GiB  denoiser "
              f"{row['denoiser_bytes'] / GIB:6.2f} GiB  encoder share {row['encoder_share_of_replicated']:.1%}")
    print(json.dumps({k: v for k, v in result.items() if k != "published_bf16"}))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
