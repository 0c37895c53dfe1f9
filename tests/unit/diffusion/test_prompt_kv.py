"""Prompt K/V prepared once per request (layers.prompt_kv, diffusion.prompt_kv) on Wan: the same numbers as the
per-step projection, and the cross-attention k/v projections run once per expert and branch, not once per step."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vidloom.core.denoiser import PreparesPrompt
from vidloom.core.loop import DONE
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.diffusion.prompt_kv import PreparedPrompts
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.families.wan.conditioning import WanPipelineConfig
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


def _run(loop: WanDenoiseLoop, request: GenerationRequest) -> tuple[torch.Tensor, PreparedPrompts]:
    slots = {"request": request, "latents": _latents(), "prompt_embeds": _embeds(1), "negative_embeds": _embeds(2)}
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


def test_sharded_weights_fall_back_to_the_embeddings():
    """--shard-weights frees a block's weights between forwards: nothing is prepared, the step projects."""
    dit, text = _dit(), _embeds(1)
    dit.blocks[1].cross_attn.k.weight.untyped_storage().resize_(0)
    assert dit.prepare_prompt(text) is None
    assert PreparedPrompts().get(dit, text) is text


def test_prepared_prompts_of_two_requests_stack_in_one_batched_forward():
    """runtime.batching stacks the requests' prepared K/V like their latents; each keeps its own rows."""
    dit = _dit()
    prompts = [PreparedPrompts(), PreparedPrompts()]
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, BatchedCFG())
    plans, alone = [], []
    with torch.inference_mode():
        for seed, request_prompts in zip((1, 3), prompts):
            slots = {"request": _request(), "latents": _latents(), "prompt_embeds": _embeds(seed),
                     "negative_embeds": _embeds(2)}
            state = loop.init(slots, None)  # type: ignore[arg-type]
            plan = loop.next(state)
            assert isinstance(plan.inputs["prompt_embeds"], PromptKV)
            plans.append(plan)
            alone.append(plan.call(**plan.inputs))
        assert batching.batch_key(plans[0]) == batching.batch_key(plans[1]) is not None
        together = batching.run_batched(plans)
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_what_a_request_keeps_is_what_the_memory_estimates_count():
    """families/*/memory.py count prompt_kv_bytes per branch (and expert): the kept K/V measure exactly that."""
    loop = WanDenoiseLoop(_dit(), SamplerConfig(), torch.float32, SequentialCFG())
    slots = {"request": _request(), "latents": _latents(), "prompt_embeds": _embeds(1), "negative_embeds": _embeds(2)}
    with torch.inference_mode():
        state = loop.init(slots, None)  # type: ignore[arg-type]
        loop.next(state)
    assert state.prompts.nbytes == 2 * prompt_kv_bytes(CONFIG.num_layers, TEXT, CONFIG.inner_dim, 4)
