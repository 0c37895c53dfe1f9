"""One forward of our Cosmos3 generation pathways (cached text prefix) vs diffusers' Cosmos3OmniTransformer.

The oracle runs the whole joint sequence [text | vision] through every layer; we prefill the text
prefix once through the shared backbone and run only the vision tokens against its cached K/V.
The sequence layout on the oracle side comes from Cosmos3OmniPipeline's own segment builders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.cosmos3_checkpoints import TinyCosmos3, write_tiny_cosmos3
from vidloom.families.cosmos3.layout import GenLayout, text_prefix_positions
from vidloom.families.cosmos3.gen_load import load_generator
from vidloom.families.cosmos3.load import load_text_model

FORWARD_TOL = 1e-5  # fp32, the same math in another order (issue #13's bound)


def _pipeline(folder: Path):
    from diffusers import Cosmos3OmniPipeline

    return Cosmos3OmniPipeline.from_pretrained(folder, enable_safety_checker=False)


def _oracle_forward(pipe, ids: list[int], latents: torch.Tensor, timestep: int, fps: float,
                    cond_frames: list[int]) -> torch.Tensor:
    text = pipe._prepare_text_segment(ids, device="cpu")
    vision = pipe._prepare_vision_segment(latents, bool(cond_frames), text["vision_start_temporal_offset"], fps,
                                          text["und_len"], "cpu", condition_frame_indexes=cond_frames)
    out = pipe.transformer(
        input_ids=text["input_ids"], text_indexes=text["text_indexes"],
        position_ids=torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], dim=1),
        und_len=text["und_len"], sequence_length=text["und_len"] + vision["num_vision_tokens"],
        vision_tokens=[latents], vision_token_shapes=vision["vision_token_shapes"],
        vision_sequence_indexes=vision["vision_sequence_indexes"],
        vision_mse_loss_indexes=vision["vision_mse_loss_indexes"],
        vision_timesteps=torch.full((vision["num_noisy_vision_tokens"],), timestep),
        vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"], return_dict=False)
    return out[0][0][0]  # [C, T, h, w]


def _one(outputs):
    """The outputs of a batch of one request, without the batch axis."""
    return tuple(None if o is None else o[0] for o in outputs)


@pytest.mark.parametrize("shape,cond_frames,fps", [((4, 1, 2, 2), [], 24.0), ((4, 3, 3, 4), [0], 16.0)])
@torch.no_grad()
def test_one_forward_matches_diffusers(tiny_cosmos3_dir: Path, shape, cond_frames, fps):
    pipe = _pipeline(tiny_cosmos3_dir)
    cpu = torch.device("cpu")
    backbone = load_text_model(tiny_cosmos3_dir / "transformer", cpu, torch.float32)
    generator = load_generator(tiny_cosmos3_dir / "transformer", cpu, torch.float32)
    ids, _ = pipe.tokenize_prompt("a red fox jumps in the snow", "", num_frames=1 + 4 * (shape[1] - 1),
                                  height=16 * shape[2], width=16 * shape[3])
    latents = torch.randn(1, *shape, generator=torch.Generator().manual_seed(3))
    want = _oracle_forward(pipe, ids, latents, 875, fps, cond_frames)

    layout = GenLayout.build(generator.config, shape, len(ids), fps, 4, tuple(cond_frames))
    prefix = torch.empty(generator.prefix_shape(len(ids)))
    generator.prefill(backbone, torch.tensor(ids), text_prefix_positions(len(ids), generator.config), prefix)
    got, sound, _ = _one(generator(backbone, prefix[None], layout, latents, torch.tensor([875])))
    err = (got - want).abs().max().item()
    print(f"{tiny_cosmos3_dir.name} {shape}: max |velocity diff| {err:.2e}, |velocity| {want.abs().max():.2f}")
    assert sound is None
    assert err < FORWARD_TOL
    # One copy: the backbone and the generation pathways together hold exactly the checkpoint's tensors.
    ours = sum(p.numel() for m in (backbone, generator) for p in m.parameters())
    assert ours == sum(p.numel() for p in pipe.transformer.parameters())
    assert want.abs().max() > 0.5
    for frame in cond_frames:  # clean frames get no prediction
        assert got[:, frame].abs().max() == 0
    # The timestep and the prompt both move the output (a dropped conditioning path could not pass).
    other_t, _, _ = _one(generator(backbone, prefix[None], layout, latents, torch.tensor([200])))
    assert (other_t - got).abs().max() > 1e-2
    prefix2 = torch.empty(generator.prefix_shape(len(ids) - 3))
    generator.prefill(backbone, torch.tensor(ids[3:]), text_prefix_positions(len(ids) - 3, generator.config), prefix2)
    other_p, _, _ = _one(generator(backbone, prefix2[None], GenLayout.build(generator.config, shape, len(ids) - 3,
                                                                         fps, 4, tuple(cond_frames)),
                                   latents, torch.tensor([875])))
    assert (other_p - got).abs().max() > 1e-2


# The Nemotron-backbone layout: squared-ReLU MLPs, no text q/k norms, a separate k norm for the text keys the
# generation pathway reads (our prefix capture undoes the rotation to apply it, see CapturePrefix).
NEMOTRON = TinyCosmos3(
    name="cosmos3-nemotron",
    transformer=dict(hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                     num_hidden_layers=2, rope_theta=10000.0, rope_axes_dim=(2, 1, 1), latent_channel=4,
                     patch_latent_dim=16, hidden_act="relu2", qk_norm_for_text=False, use_und_k_norm_for_gen=True),
)


@torch.no_grad()
def test_nemotron_layout_with_a_generation_k_norm(tmp_path: Path):
    folder = write_tiny_cosmos3(tmp_path / NEMOTRON.name, NEMOTRON)
    pipe = _pipeline(folder)
    assert pipe.transformer.layers[0].self_attn.k_norm_und_for_gen is not None
    cpu = torch.device("cpu")
    backbone = load_text_model(folder / "transformer", cpu, torch.float32)
    generator = load_generator(folder / "transformer", cpu, torch.float32)
    shape = (4, 2, 2, 2)
    ids, _ = pipe.tokenize_prompt("a red fox", "", num_frames=5, height=32, width=32)
    latents = torch.randn(1, *shape, generator=torch.Generator().manual_seed(1))
    want = _oracle_forward(pipe, ids, latents, 600, 24.0, [])
    prefix = torch.empty(generator.prefix_shape(len(ids)))
    generator.prefill(backbone, torch.tensor(ids), text_prefix_positions(len(ids), generator.config), prefix)
    got, _, _ = _one(generator(backbone, prefix[None], GenLayout.build(generator.config, shape, len(ids), 24.0, 4),
                               latents, torch.tensor([600])))
    err = (got - want).abs().max().item()
    print(f"nemotron layout: max |velocity diff| {err:.2e}")
    assert err < FORWARD_TOL and want.abs().max() > 0.5
