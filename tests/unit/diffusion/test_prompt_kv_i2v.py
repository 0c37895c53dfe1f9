"""Wan2.1 I2V's CLIP image keys/values prepared once per request (WanTransformer.prepare_image,
ImageConditionedNetwork.prepare_network, PreparedPrompts.network): the same numbers as projecting the image tokens
at every step, and every block's image k/v projections run once per request, not per step and CFG branch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vidloom.core.loop import DONE
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.families.wan.conditioning import ImageConditionedNetwork
from vidloom.families.wan.loop import WanDenoiseLoop
from vidloom.layers.prompt_kv import PromptKV, prompt_kv_bytes
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime import batching

IMAGE_TOKENS, IMAGE_DIM, TEXT, STEPS = 5, 10, 7, 3


def _config(first_last: bool = False) -> WanTransformerConfig:
    return WanTransformerConfig(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                out_channels=4, text_dim=12, freq_dim=16, ffn_dim=24, num_layers=3,
                                image_dim=IMAGE_DIM, added_kv_proj_dim=16,
                                pos_embed_seq_len=2 * IMAGE_TOKENS if first_last else None)


def _dit(first_last: bool = False) -> WanTransformer:
    torch.manual_seed(0)
    dit = WanTransformer(_config(first_last)).eval()
    with torch.no_grad():  # random init leaves the image path faint: scale it so a wrong image K/V shows
        for block in dit.blocks:
            block.cross_attn.image_k.weight.mul_(4)
            block.cross_attn.image_v.weight.mul_(4)
    return dit


def _randn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _images(seed: int = 5, first_last: bool = False) -> torch.Tensor:
    return _randn(seed, 2 if first_last else 1, IMAGE_TOKENS, IMAGE_DIM) * 3


class _ImageProjections:
    """Counts the rows every block's image k and v projections ran on (forward hooks on the shared modules)."""

    def __init__(self, dit: WanTransformer) -> None:
        self.rows = 0
        for block in dit.blocks:
            for linear in (block.cross_attn.image_k, block.cross_attn.image_v):
                linear.register_forward_hook(lambda m, args, out: setattr(self, "rows", self.rows + args[0].shape[0]))


@pytest.mark.parametrize("first_last", [False, True], ids=["i2v", "first-last"])
def test_prepared_image_kv_give_the_per_step_forward(first_last):
    dit = _dit(first_last)
    view = ImageConditionedNetwork(dit, _images(first_last=first_last))
    prepared = view.prepare_network()
    assert isinstance(prepared, ImageConditionedNetwork) and isinstance(prepared.image_kv, PromptKV)
    latents, t, text = _randn(9, 1, 4, 2, 4, 4), torch.tensor([700.0]), _randn(1, 1, TEXT, 12)
    with torch.no_grad():
        # One branch: the same ops on the same rows, bit for bit.
        assert torch.equal(prepared(latents, t, text), view(latents, t, text))
        # CFG batched: one request's K/V repeated for both rows vs the tokens projected on two rows (GEMM rows
        # are independent on CPU; 1e-6 leaves room for another BLAS blocking the two row counts).
        both = (latents.repeat(2, 1, 1, 1, 1), t.repeat(2), torch.cat([text, _randn(2, 1, TEXT, 12)]))
        torch.testing.assert_close(prepared(*both), view(*both), atol=1e-6, rtol=0)
        # The image must matter, or the above would pass with the image path dropped.
        other = ImageConditionedNetwork(dit, _images(6, first_last)).prepare_network()
        assert float((other(latents, t, text) - prepared(latents, t, text)).abs().max()) > 1e-3


def _request() -> GenerationRequest:
    return GenerationRequest("p", negative_prompt="n", height=32, width=32, num_frames=5, num_inference_steps=STEPS,
                             seed=0, sampler="euler", flow_shift=3.0, guidance_scale=5.0)


def _slots(seed: int = 1) -> dict[str, Any]:
    return {"request": _request(), "latents": _randn(9, 1, 4, 2, 4, 4), "prompt_embeds": _randn(seed, 1, TEXT, 12),
            "negative_embeds": _randn(2, 1, TEXT, 12), "image_embeds": _images()}


def _run(loop: WanDenoiseLoop) -> tuple[torch.Tensor, PreparedPrompts]:
    with torch.inference_mode():
        state = loop.init(_slots(), None)  # type: ignore[arg-type]
        prompts = state.prompts
        while (plan := loop.next(state)) is not DONE:
            loop.advance(state, plan.call(**plan.inputs))
        return loop.finalize(state)["latents"], prompts


@pytest.mark.parametrize("policy", [SequentialCFG(), BatchedCFG()], ids=["sequential", "batched"])
def test_the_loop_projects_the_image_once_per_request(policy):
    dit = _dit()
    counter = _ImageProjections(dit)
    reused, prompts = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy))
    assert prompts.prepared == 3  # the image once, the prompt and the negative prompt once each
    assert counter.rows == 2 * dit.config.num_layers  # one image row through every block's k and v, once
    counter.rows = 0
    per_step, _ = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy, prepare_prompts=False))
    assert counter.rows == STEPS * 2 * 2 * dit.config.num_layers  # each step, each branch's row
    # Sequential (the default cfg_mode, diffusers' order): bit for bit. Batched: the image K/V of one row repeated
    # vs projected on two rows differ by <= 4.2e-7 per forward (observed; 1e-6 above); guidance 5 scales the
    # branches' difference and three steps add up: 1.8e-6 observed on latents of magnitude ~3.
    torch.testing.assert_close(reused, per_step, atol=5e-6 if isinstance(policy, BatchedCFG) else 0, rtol=0)


def test_the_prepared_image_kv_are_counted_in_what_the_request_keeps():
    """wan.memory counts one request's image K/V besides the prompt's: the kept bytes are exactly that."""
    dit = _dit()
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, SequentialCFG())
    with torch.inference_mode():
        state = loop.init(_slots(), None)  # type: ignore[arg-type]
        loop.next(state)
    dim, layers = dit.config.inner_dim, dit.config.num_layers
    assert state.prompts.nbytes == (2 * prompt_kv_bytes(layers, TEXT, dim, 4)
                                    + prompt_kv_bytes(layers, IMAGE_TOKENS, dim, 4))


def test_prepared_views_of_two_requests_stack_in_one_batched_forward():
    """runtime.batching stacks the requests' image K/V like their CLIP tokens; each keeps its own images."""
    dit = _dit()
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, BatchedCFG())
    plans, alone = [], []
    with torch.inference_mode():
        for seed in (1, 3):
            slots = dict(_slots(seed), image_embeds=_images(seed + 10))
            plan = loop.next(loop.init(slots, None))  # type: ignore[arg-type]
            assert isinstance(plan.inputs["network"].image_kv, PromptKV)
            plans.append(plan)
            alone.append(plan.call(**plan.inputs))
        assert batching.batch_key(plans[0]) == batching.batch_key(plans[1]) is not None
        together = batching.run_batched(plans)
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sharded_weights_leave_the_view_projecting():
    """--shard-weights frees a block's weights between forwards: the view stays unprepared, the step projects."""
    dit = _dit()
    dit.blocks[2].cross_attn.image_v.weight.untyped_storage().resize_(0)
    view = ImageConditionedNetwork(dit, _images())
    assert view.prepare_network() is None
    assert PreparedPrompts().network(view) is view
