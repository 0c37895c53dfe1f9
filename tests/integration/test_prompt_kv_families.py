"""Every family whose blocks cross-attend to a static prompt projects its K/V once per request and CFG branch
(layers.prompt_kv, diffusion.prompt_kv), through the engine: a hook on every block's cross-attention key projection
counts the prompt rows it ran on over a whole multi-step generation. Per step it would be steps x branches rows."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image
from torch import nn

from vidloom.generator import VideoGenerator

STEPS = 3
SANA_CAMERA = {"camera": "w-8", "intrinsics": [100.0, 100.0, 48.0, 32.0]}


def _first_frame() -> Image.Image:
    return Image.fromarray((np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8))


# demo -> (the blocks' cross-attention key projections, request fields)
CASES: dict[str, tuple[Callable[[Any], list[nn.Module]], dict[str, Any]]] = {
    "wan2.1-demo": (lambda dit: [b.cross_attn.k for b in dit.blocks], {"height": 64, "width": 64, "num_frames": 5}),
    "helios-demo": (lambda dit: [b.cross_attn.k for b in dit.blocks], {"height": 32, "width": 32, "num_frames": 33}),
    "stable-audio-demo": (lambda dit: [b.attn2.to_k for b in dit.blocks], {"seconds": 0.5}),
    "sana-wm-demo": (lambda dit: [b.cross_attn.kv_linear for b in dit.blocks], {"num_frames": 9, **SANA_CAMERA}),
}


@pytest.mark.parametrize("demo", list(CASES))
def test_the_prompt_is_projected_once_per_branch_not_per_step(demo, tmp_path_factory):
    if demo == "stable-audio-demo":
        pytest.importorskip("torchsde")
    projections, fields = CASES[demo]
    gen = VideoGenerator.from_pretrained(demo, device="cpu", cache_dir=tmp_path_factory.mktemp(demo))
    rows: list[int] = []
    for module in projections(gen.engine.instance["transformer"]):
        module.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    request = {"seed": 0, "num_inference_steps": STEPS, "guidance_scale": 4.0, "negative_prompt": "blurry", **fields}
    if demo == "sana-wm-demo":
        request["image"] = _first_frame()
    gen.generate("a red fox jumps over a frozen river", **request)
    blocks = len(projections(gen.engine.instance["transformer"]))
    # The prompt and the negative prompt, one row each, once for the whole request (every chunk and step).
    assert sum(rows) == 2 * blocks, f"{demo}: {sum(rows)} prompt rows projected over {blocks} blocks"


def test_wan_i2v_projects_the_clip_image_once_per_request(tmp_path):
    """Wan2.1 I2V: besides the prompt's, every block's image k projection runs on the request's CLIP tokens once
    (one row, shared by both CFG branches and every step), not steps x branches rows."""
    from tests.helpers.wan_i2v_checkpoints import make_image, write_tiny_wan_i2v

    gen = VideoGenerator.from_pretrained(write_tiny_wan_i2v(tmp_path / "wan-i2v"), device="cpu")
    dit = gen.engine.instance["transformer"]
    text_rows: list[int] = []
    image_rows: list[int] = []
    for block in dit.blocks:
        block.cross_attn.k.register_forward_hook(lambda m, args, out: text_rows.append(args[0].shape[0]))
        block.cross_attn.image_k.register_forward_hook(lambda m, args, out: image_rows.append(args[0].shape[0]))
    gen.generate("a red fox jumps over a frozen river", image=make_image(48, 32, seed=1), height=32, width=48,
                 num_frames=5, seed=0, num_inference_steps=STEPS, guidance_scale=4.0, negative_prompt="blurry")
    blocks = len(dit.blocks)
    assert sum(text_rows) == 2 * blocks, f"{sum(text_rows)} prompt rows projected over {blocks} blocks"
    assert sum(image_rows) == blocks, f"{sum(image_rows)} image rows projected over {blocks} blocks"
