"""Qwen-Image's two costs, vidloom vs diffusers in one process: one denoiser forward and the one-frame VAE decode.

On the qwen-image-mid checkpoint (bench/family_bench.py: an MMDiT of 8 heads x 64 and 6 dual-stream blocks, an
AutoencoderKLQwenImage of base_dim 32, 256 x 256 images), float32, the same weights and inputs on both sides:

- step: one transformer forward over the 256 image tokens and a 121-token prompt (what the bench prompt encodes to
  with the tiny tokenizer), at timestep 0.7: one branch of a true-CFG step (the pipeline runs the two one after
  the other, as vidloom's default does).
- decode: raw latents [1, 16, 1, 32, 32] -> the [-1, 1] image (vidloom's WanVAE.decode; diffusers'
  AutoencoderKLQwenImage.decode, clamped as the pipeline's postprocess clamps).

Rounds interleave the sides and medians are reported with the load average (bench/helios_parts.py's measure and
profile); `--profile` prints each side's torch.profiler table of one call instead.

    python bench/qwen_image_parts.py [--parts step,decode] [--rounds 7] [--threads 1] [--profile]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

from family_bench import FAMILIES  # noqa: E402
from helios_parts import Call, measure, profile, report  # noqa: E402

FAMILY = "qwen-image-mid"
PROMPT_TOKENS = 121  # family_bench.PROMPT through the checkpoint's tokenizer and template


def step_calls(folder: Path) -> tuple[Call, Call]:
    """One transformer forward on each side from the same tokens."""
    from diffusers import QwenImageTransformer2DModel

    from vidloom.families.qwen_image.transformer import (
        QWEN_IMAGE_TRANSFORMER_NAME_MAP, QwenImageTransformer, QwenImageTransformerConfig,
    )
    from vidloom.loading.component_file import build_component

    component = folder / "transformer"
    ref = QwenImageTransformer2DModel.from_pretrained(str(component), torch_dtype=torch.float32).eval()
    config = QwenImageTransformerConfig.from_diffusers(json.loads((component / "config.json").read_text()))
    ours = build_component(lambda: QwenImageTransformer(config), component, QWEN_IMAGE_TRANSFORMER_NAME_MAP, None,
                           (), torch.device("cpu"), torch.float32, QwenImageTransformer.KEEP_FP32).eval()
    seeded = torch.Generator().manual_seed(0)
    side = 16  # 256 x 256 pixels: 32 x 32 latents in 2 x 2 patches
    img = torch.randn(1, side * side, config.in_channels, generator=seeded)
    txt = torch.randn(1, PROMPT_TOKENS, config.text_dim, generator=seeded)
    timestep = torch.tensor([0.7])

    def reference() -> torch.Tensor:
        return ref(hidden_states=img, encoder_hidden_states=txt, encoder_hidden_states_mask=None, timestep=timestep,
                   img_shapes=[[(1, side, side)]], return_dict=False)[0]

    return (lambda: ours(img, txt, timestep, ((side, side),))), reference


def decode_calls(folder: Path) -> tuple[Call, Call]:
    """One image's decode on each side from the same raw latents."""
    from diffusers import AutoencoderKLQwenImage

    from vidloom.families.qwen_image.load import vae_config
    from vidloom.loading.component_file import load_component
    from vidloom.models.wan.vae import WAN_VAE_NAME_MAP, WanVAE

    component = folder / "vae"
    ref = AutoencoderKLQwenImage.from_pretrained(str(component), torch_dtype=torch.float32).eval()
    ours = WanVAE(vae_config(json.loads((component / "config.json").read_text())))
    load_component(ours, component, WAN_VAE_NAME_MAP)
    latents = torch.randn(1, ref.config.z_dim, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    return (lambda: ours.eval().decode(latents)), (lambda: ref.decode(latents, return_dict=False)[0].clamp(-1, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="step,decode", help="comma-separated: step, decode")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table per side instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = FAMILIES[FAMILY].checkpoint()
    makers = {"step": step_calls, "decode": decode_calls}
    calls = {part: makers[part](folder) for part in args.parts.split(",")}
    if args.profile:
        profile(calls)
        return 0
    report(measure(calls, args.rounds), "qwen_image_parts", FAMILY, args.rounds, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
