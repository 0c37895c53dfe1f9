"""Where Flux2 Klein's bf16 error comes from: one transformer forward in bf16 against float32 (SNR in dB).

On the side-by-side report's mid-size random checkpoint (bench/family_bench.py flux2-klein-mid), random
inputs at a text scale like the encoder's: vidloom's bf16 with its float32 islands (Flux2Transformer.KEEP_FP32),
the same with the timestep rounded to bf16 the way the reference's bf16 path does (bf16(t) x 1000 in bf16), and
diffusers' bf16 transformer against its float32. Writes bench/results/flux2_precision.json.

    python bench/flux2_precision.py
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_bench import FAMILIES  # noqa: E402  (puts the repo root on sys.path)
from report import environment, write_json  # noqa: E402

from vidloom.loading.diffusers_dir import DiffusersDir  # noqa: E402
from vidloom.loading.precision import cast_module  # noqa: E402
from vidloom.loading.safetensors_io import load_weights  # noqa: E402
from vidloom.families.flux2.transformer import (  # noqa: E402
    FLUX2_TRANSFORMER_NAME_MAP, Flux2Transformer, Flux2TransformerConfig,
)

TIMESTEPS = (1.0, 0.75, 0.3721)
TEXT_STD = 0.4  # the mid checkpoint's encoder output std (measured: 0.41)


def snr_db(approx: torch.Tensor, exact: torch.Tensor) -> float:
    exact, approx = exact.double(), approx.double()
    return round(10 * math.log10(float((exact**2).mean() / ((approx - exact) ** 2).mean())), 2)


def main() -> int:
    from diffusers import Flux2Transformer2DModel

    folder = DiffusersDir.open(FAMILIES["flux2-klein-mid"].checkpoint())
    config = folder.parse_component("transformer", Flux2TransformerConfig.from_diffusers)
    weights = folder.component_dir("transformer")

    def ours(dtype: torch.dtype) -> Flux2Transformer:
        model = Flux2Transformer(config)
        load_weights(model, weights, FLUX2_TRANSFORMER_NAME_MAP)
        return cast_module(model, dtype, Flux2Transformer.KEEP_FP32).eval()

    ref32 = Flux2Transformer2DModel.from_pretrained(str(weights)).eval()
    ref16 = Flux2Transformer2DModel.from_pretrained(str(weights), torch_dtype=torch.bfloat16).eval()
    ours32, ours16 = ours(torch.float32), ours(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    img = torch.randn(1, 256, config.in_channels, generator=gen)
    txt = torch.randn(1, 512, config.text_dim, generator=gen) * TEXT_STD
    rows, cols = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    zeros = torch.zeros(256, dtype=torch.long)
    img_ids = torch.stack([zeros, rows.flatten(), cols.flatten(), zeros], dim=-1)
    txt_ids = torch.stack([torch.zeros(512, dtype=torch.long)] * 3 + [torch.arange(512)], dim=-1)

    def reference(model: torch.nn.Module, dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
        return model(hidden_states=img.to(dtype), encoder_hidden_states=txt.to(dtype), timestep=t.to(dtype),
                     img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)[0].float()

    results = []
    with torch.inference_mode():
        for value in TIMESTEPS:
            t = torch.tensor([value])
            exact = ours32(img, txt, t, img_ids, txt_ids)
            rounded_t = (t.bfloat16() * 1000).float() / 1000  # what bf16(t) * 1000 in bf16 feeds the sinusoid
            ref_exact = reference(ref32, torch.float32, t)
            row = {
                "timestep": value,
                "vidloom_bf16_islands_db": snr_db(ours16(img.bfloat16(), txt.bfloat16(), t, img_ids, txt_ids), exact),
                "vidloom_bf16_timestep_rounded_db": snr_db(
                    ours16(img.bfloat16(), txt.bfloat16(), rounded_t, img_ids, txt_ids), exact),
                "diffusers_bf16_db": snr_db(reference(ref16, torch.bfloat16, t), ref_exact),
                "vidloom_fp32_vs_diffusers_fp32_db": snr_db(exact, ref_exact),
            }
            print(row, flush=True)
            results.append(row)
    write_json("flux2_precision.json", {"environment": environment(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
                                        "checkpoint": "flux2-klein-mid", "text_std": TEXT_STD, "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
