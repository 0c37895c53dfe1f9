"""Prompt K/V prepared once per request (layers.prompt_kv, diffusion.prompt_kv) on Wan: the same numbers as the
per-step projection, and the cross-attention k/v projections run once per expert and branch, not once per step;
Wan2.1 I2V's CLIP image K/V once per request (WanTransformer.prepare_image, ImageConditionedNetwork.prepare_network,
PreparedPrompts.network), shared by both CFG branches."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from tests.helpers.freed_blocks import FreedBlock
from vidloom.core.denoiser import PreparesPrompt
from vidloom.core.loop import DONE
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.families.wan.conditioning import ImageConditionedNetwork, WanPipelineConfig
from vidloom.families.wan.loop import WanDenoiseLoop
from vidloom.layers.prompt_kv import PromptKV, prompt_kv_bytes
from vidloom.lora.apply import ActiveLoRAs, lora_scope
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime import batching

CONFIG = WanTransformerConfig(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                              out_channels=4, text_dim=12, freq_dim=16, ffn_dim=24, num_layers=3)
TEXT, STEPS = 7, 4


def _dit(seed: int = 0) -> WanTransformer:
    torch.manual_seed(seed)
    return WanTransformer(CONFIG).eval()


def _embeds(seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, TEXT, CONFIG.text_dim, generator=torch.Generator().manual_seed(seed))


def _latents(batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 4, 2, 4, 4, generator=torch.Generator().manual_seed(9))


class _Projections:
    """Counts the rows every cross-attention k and v projection ran on (forward hooks on the shared modules)."""

    def __init__(self, *dits: WanTransformer) -> None:
        self.rows = 0
        self.calls = 0
        for dit in dits:
            for block in dit.blocks:
                for linear in (block.cross_attn.k, block.cross_attn.v):
                    linear.register_forward_hook(self._count)

    def _count(self, module: Any, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        self.calls += 1
        self.rows += args[0].shape[0]


def test_a_prepared_prompt_gives_the_per_step_forward_bit_for_bit():
    dit = _dit()
    assert isinstance(dit, PreparesPrompt)
    latents, t, text = _latents(), torch.tensor([700.0]), _embeds(1)
    with torch.no_grad():
        prepared = dit.prepare_prompt(text)
        assert torch.equal(dit(latents, t, prepared), dit(latents, t, text))
        # CFG stacked in one call: each branch prepared alone, then stacked (GEMM rows are independent on CPU).
        both = PromptKV.stack([prepared, dit.prepare_prompt(_embeds(2))])
        got = dit(latents.repeat(2, 1, 1, 1, 1), t.repeat(2), both)
        want = dit(latents.repeat(2, 1, 1, 1, 1), t.repeat(2), torch.cat([text, _embeds(2)]))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def _request(guidance: float = 5.0, **options: Any) -> GenerationRequest:
    return GenerationRequest("p", negative_prompt="n", height=32, width=32, num_frames=5, num_inference_steps=STEPS,
                             seed=0, sampler="euler", flow_shift=3.0, guidance_scale=guidance, options=options)


def _run(loop: WanDenoiseLoop, request: GenerationRequest,
         image_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, PreparedPrompts]:
    slots = {"request": request, "latents": _latents(), "prompt_embeds": _embeds(1), "negative_embeds": _embeds(2),
             "image_embeds": image_embeds}
    with torch.inference_mode():
        state = loop.init(slots, None)  # type: ignore[arg-type]
        prompts = state.prompts
        while (plan := loop.next(state)) is not DONE:
            loop.advance(state, plan.call(**plan.inputs))
        return loop.finalize(state)["latents"], prompts


@pytest.mark.parametrize("policy", [SequentialCFG(), BatchedCFG()], ids=["sequential", "batched"])
def test_the_loop_projects_the_prompt_once_per_branch(policy):
    dit = _dit()
    counter = _Projections(dit)
    reused, prompts = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy), _request())
    assert prompts.prepared == 2  # cond and uncond, once each
    assert counter.rows == 2 * 2 * CONFIG.num_layers  # one row per branch through every block's k and v
    counter.rows = 0
    per_step, _ = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy, prepare_prompts=False), _request())
    assert counter.rows == STEPS * 2 * 2 * CONFIG.num_layers
    # Sequential: the same ops on the same rows (bit for bit); batched: per-branch GEMMs against one of 2 rows.
    torch.testing.assert_close(reused, per_step, atol=1e-6 if isinstance(policy, BatchedCFG) else 0, rtol=0)


def test_each_expert_prepares_its_own_prompt():
    """Wan2.2 A14B: the high-noise expert's K/V never serve the low-noise expert (their k/v weights differ)."""
    high, low = _dit(0), _dit(1)
    counter = _Projections(high, low)
    loop = WanDenoiseLoop(high, SamplerConfig(), torch.float32, SequentialCFG(), transformer_2=low,
                          pipeline=WanPipelineConfig(boundary_ratio=0.5))
    reused, prompts = _run(loop, _request(guidance_scale_2=3.0))
    assert prompts.prepared == 4 and counter.rows == 4 * 2 * CONFIG.num_layers
    loop.prepare_prompts = False
    per_step, _ = _run(loop, _request(guidance_scale_2=3.0))
    assert torch.equal(reused, per_step)


def test_another_adapter_set_prepares_again():
    """K/V are prepared under the adapters active when the step is planned; a different set is a new entry."""
    dit, text = _dit(), _embeds(1)
    prompts = PreparedPrompts()
    with torch.inference_mode():
        plain = prompts.get(dit, text)
        assert prompts.get(dit, text) is plain
        with lora_scope(ActiveLoRAs({})):
            assert prompts.get(dit, text) is not plain
        assert prompts.prepared == 2
    assert PreparedPrompts(enabled=False).get(dit, text) is text


def test_sharded_weights_are_gathered_block_by_block_to_prepare_the_prompt():
    """--shard-weights frees a block's weights between forwards: each is gathered in turn for its projection
    (layers.sharded) and freed again, and the prepared K/V equal the unsharded ones."""
    dit, text = _dit(), _embeds(1)
    want = dit.prepare_prompt(text)
    shards = [FreedBlock(block) for block in dit.blocks]
    got = PreparedPrompts().get(dit, text)
    assert isinstance(got, PromptKV) and [s.gathers for s in shards] == [1] * len(shards)
    assert not any(s.resident() for s in shards)
    assert all(torch.equal(a, b) for a, b in zip((*want.keys, *want.values), (*got.keys, *got.values)))


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_prepared_prompts_of_two_requests_stack_in_one_batched_forward(i2v):
    """runtime.batching stacks the requests' prepared K/V like their latents (an I2V view's image K/V like its
    CLIP tokens); each keeps its own rows."""
    dit = _i2v_dit() if i2v else _dit()
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, BatchedCFG())
    plans, alone = [], []
    with torch.inference_mode():
        for seed in (1, 3):
            slots = {"request": _request(), "latents": _latents(), "prompt_embeds": _embeds(seed),
                     "negative_embeds": _embeds(2), "image_embeds": _images(seed + 10) if i2v else None}
            state = loop.init(slots, None)  # type: ignore[arg-type]
            plan = loop.next(state)
            assert isinstance(plan.inputs["prompt_embeds"], PromptKV)
            assert not i2v or isinstance(plan.inputs["network"].image_kv, PromptKV)
            plans.append(plan)
            alone.append(plan.call(**plan.inputs))
        assert batching.batch_key(plans[0]) == batching.batch_key(plans[1]) is not None
        together = batching.run_batched(plans)
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_what_a_request_keeps_is_what_the_memory_estimates_count(i2v):
    """families/*/memory.py count prompt_kv_bytes per branch (and expert), and an I2V request's image K/V once:
    the kept K/V measure exactly that."""
    loop = WanDenoiseLoop(_i2v_dit() if i2v else _dit(), SamplerConfig(), torch.float32, SequentialCFG())
    slots = {"request": _request(), "latents": _latents(), "prompt_embeds": _embeds(1), "negative_embeds": _embeds(2),
             "image_embeds": _images() if i2v else None}
    with torch.inference_mode():
        state = loop.init(slots, None)  # type: ignore[arg-type]
        loop.next(state)
    image = prompt_kv_bytes(CONFIG.num_layers, IMAGE_TOKENS, CONFIG.inner_dim, 4) if i2v else 0
    assert state.prompts.nbytes == 2 * prompt_kv_bytes(CONFIG.num_layers, TEXT, CONFIG.inner_dim, 4) + image


IMAGE_TOKENS, IMAGE_DIM = 5, 10


def _i2v_dit(first_last: bool = False) -> WanTransformer:
    """CONFIG as a Wan2.1 I2V DiT (CLIP cross-attention; first-last-frame: two images joined by a position table)."""
    torch.manual_seed(0)
    dit = WanTransformer(dataclasses.replace(CONFIG, image_dim=IMAGE_DIM, added_kv_proj_dim=CONFIG.inner_dim,
                                             pos_embed_seq_len=2 * IMAGE_TOKENS if first_last else None)).eval()
    with torch.no_grad():  # random init leaves the image path faint: scale it so a wrong image K/V shows
        for block in dit.blocks:
            block.cross_attn.image_k.weight.mul_(4)
            block.cross_attn.image_v.weight.mul_(4)
    return dit


def _images(seed: int = 5, first_last: bool = False) -> torch.Tensor:
    shape = (2 if first_last else 1, IMAGE_TOKENS, IMAGE_DIM)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


class _ImageProjections:
    """Counts the rows every block's image k and v projections ran on (forward hooks on the shared modules)."""

    def __init__(self, dit: WanTransformer) -> None:
        self.rows = 0
        for block in dit.blocks:
            for linear in (block.cross_attn.image_k, block.cross_attn.image_v):
                linear.register_forward_hook(lambda m, args, out: setattr(self, "rows", self.rows + args[0].shape[0]))


@pytest.mark.parametrize("first_last", [False, True], ids=["i2v", "first-last"])
def test_prepared_image_kv_give_the_per_step_forward(first_last):
    dit = _i2v_dit(first_last)
    view = ImageConditionedNetwork(dit, _images(first_last=first_last))
    prepared = view.prepare_network()
    assert isinstance(prepared, ImageConditionedNetwork) and isinstance(prepared.image_kv, PromptKV)
    latents, t, text = _latents(), torch.tensor([700.0]), _embeds(1)
    with torch.no_grad():
        # One branch: the same ops on the same rows, bit for bit.
        assert torch.equal(prepared(latents, t, text), view(latents, t, text))
        # CFG batched: one request's K/V repeated for both rows vs the tokens projected on two rows (GEMM rows
        # are independent on CPU; 1e-6 leaves room for another BLAS blocking the two row counts).
        both = (latents.repeat(2, 1, 1, 1, 1), t.repeat(2), torch.cat([text, _embeds(2)]))
        torch.testing.assert_close(prepared(*both), view(*both), atol=1e-6, rtol=0)
        # The image must matter, or the above would pass with the image path dropped.
        other = ImageConditionedNetwork(dit, _images(6, first_last)).prepare_network()
        assert float((other(latents, t, text) - prepared(latents, t, text)).abs().max()) > 1e-3


@pytest.mark.parametrize("policy", [SequentialCFG(), BatchedCFG()], ids=["sequential", "batched"])
def test_the_loop_projects_the_image_once_per_request(policy):
    dit = _i2v_dit()
    counter = _ImageProjections(dit)
    reused, prompts = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy), _request(), _images())
    assert prompts.prepared == 3  # the image once, the prompt and the negative prompt once each
    assert counter.rows == 2 * dit.config.num_layers  # one image row through every block's k and v, once
    counter.rows = 0
    per_step, _ = _run(WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy, prepare_prompts=False), _request(),
                       _images())
    assert counter.rows == STEPS * 2 * 2 * dit.config.num_layers  # each step, each branch's row
    # Sequential (the default cfg_mode, diffusers' order): bit for bit. Batched: the image K/V of one row repeated
    # vs projected on two rows differ by <= 4.2e-7 per forward (observed; 1e-6 above); guidance 5 scales the
    # branches' difference and the steps add up (1.4e-6 observed over four steps, on latents of magnitude ~3).
    torch.testing.assert_close(reused, per_step, atol=5e-6 if isinstance(policy, BatchedCFG) else 0, rtol=0)


def test_sharded_weights_are_gathered_to_prepare_the_image_keys_and_values():
    """--shard-weights: the image K/V are prepared with each block gathered in turn, equal to the unsharded ones."""
    dit = _i2v_dit()
    want = ImageConditionedNetwork(dit, _images()).prepare_network().image_kv
    shards = [FreedBlock(block) for block in dit.blocks]
    got = PreparedPrompts().network(ImageConditionedNetwork(dit, _images())).image_kv
    assert [s.gathers for s in shards] == [1] * len(shards) and not any(s.resident() for s in shards)
    assert all(torch.equal(a, b) for a, b in zip((*want.keys, *want.values), (*got.keys, *got.values)))
