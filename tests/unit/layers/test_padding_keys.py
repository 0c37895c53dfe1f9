"""Collapsed prompt padding keys (layers.prompt_kv.collapsed_padding): Wan's zero-padded prompt rows all project to
one key and value per block, so the real keys plus a few copies of the padding key with a log-count bias attend
exactly as all 512 keys do (float32, within 1e-5: only the summation order changes), for any real length, a CFG
pair of different lengths (BatchedCFG, runtime.batching), a prompt with no padding (nothing collapses), and Helios'
blocks (the same text layout)."""

from __future__ import annotations

import math

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.loop import DONE
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import BatchedCFG, SequentialCFG
from vidloom.diffusion.sampler import SamplerConfig
from vidloom.families.wan.loop import WanDenoiseLoop
from vidloom.layers.prompt_kv import PromptKV, collapsed_padding, padding_key_multiple
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime import batching
from vidloom.runtime.prompt_buckets import PROMPT_BUCKET, prompt_bucket

CONFIG = WanTransformerConfig(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                              out_channels=4, text_dim=12, freq_dim=16, ffn_dim=24, num_layers=3)
TEXT = 128  # the prompt length the pipeline pads to (512 on the real checkpoints)
TOLERANCE = dict(atol=1e-5, rtol=0)


def _dit() -> WanTransformer:
    torch.manual_seed(0)
    dit = WanTransformer(CONFIG).eval()
    with torch.no_grad():  # sharpen the scores so the padding key's weight is not drowned in a flat softmax
        for block in dit.blocks:
            block.cross_attn.k.weight.mul_(3)
    return dit


def _prompt(real: int, seed: int = 1) -> torch.Tensor:
    """[1, TEXT, text_dim]: `real` random rows, then the zero rows the pipeline pads with."""
    embeds = torch.zeros(1, TEXT, CONFIG.text_dim)
    embeds[:, :real] = torch.randn(1, real, CONFIG.text_dim, generator=torch.Generator().manual_seed(seed))
    return embeds


def _latents(batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 4, 2, 4, 4, generator=torch.Generator().manual_seed(9))


def test_the_layout_keeps_real_rows_and_spreads_the_padding_count():
    embeds = torch.cat([_prompt(3), _prompt(20)])
    kept, bias = collapsed_padding(embeds, 16)
    assert kept == 32 and bias is not None and bias.shape == (2, 32)
    assert torch.equal(bias[0, :3], torch.zeros(3)) and torch.equal(bias[1, :20], torch.zeros(20))
    # Row 0: 125 padding rows stood for by 29 copies; row 1: 108 by 12.
    torch.testing.assert_close(bias[0, 3:], torch.full((29,), math.log(125 / 29)))
    torch.testing.assert_close(bias[1, 20:], torch.full((12,), math.log(108 / 12)))
    assert collapsed_padding(_prompt(TEXT), 16) == (TEXT, None)  # no padding: nothing to collapse
    assert collapsed_padding(_prompt(120), 16) == (TEXT, None)  # the rounding reaches the full length
    assert collapsed_padding(_prompt(3).bfloat16(), 16) == (TEXT, None)  # log(n / m) too coarse in bfloat16
    kept, bias = collapsed_padding(torch.zeros(1, TEXT, 4), 16)  # all padding: one key standing for all
    assert kept == 16 and bias is not None and torch.allclose(bias, torch.full((1, 16), math.log(TEXT / 16)))


@pytest.mark.parametrize("real", [1, 5, 16, 40, 100, 127, TEXT])
def test_collapsed_keys_attend_as_all_the_padding_does(real):
    dit, text = _dit(), _prompt(real)
    latents, t = _latents(), torch.tensor([700.0])
    with torch.no_grad():
        collapsed = dit.prepare_prompt(text)
        dit.prompt_key_multiple = None
        full = dit.prepare_prompt(text)
        assert full.keys[0].shape[1] == TEXT and full.bias is None
        want = dit(latents, t, full)
    kept = collapsed.keys[0].shape[1]
    assert kept == min(TEXT, -(-(real + 1) // 16) * 16) and (collapsed.bias is None) == (kept == TEXT)
    torch.testing.assert_close(dit(latents, t, collapsed), want, **TOLERANCE)
    torch.testing.assert_close(want, dit(latents, t, text), atol=1e-6, rtol=0)  # prepared == per-step, as before


@pytest.mark.parametrize("lengths", [(3, 40), (TEXT, 9), (0, 70)], ids=["short-long", "unpadded-short", "empty"])
def test_a_cfg_pair_of_different_lengths_stacks_with_masked_filler(lengths):
    dit = _dit()
    cond, uncond = (_prompt(n, seed) for n, seed in zip(lengths, (1, 2)))
    latents, t = _latents(2), torch.tensor([700.0, 700.0])
    with torch.no_grad():
        prepared = [dit.prepare_prompt(cond), dit.prepare_prompt(uncond)]
        stacked = PromptKV.stack(prepared)
        assert stacked.bias is not None and stacked.batch == 2
        for row, kept in enumerate(p.keys[0].shape[1] for p in prepared):  # each row's filler is masked out
            assert torch.isfinite(stacked.bias[row, :kept]).all() and torch.isinf(stacked.bias[row, kept:]).all()
        torch.testing.assert_close(dit(latents, t, stacked), dit(latents, t, torch.cat([cond, uncond])), **TOLERANCE)
        # rows / repeat keep each row's bias with its keys
        torch.testing.assert_close(dit(latents[:1], t[:1], stacked.rows(slice(1, 2))),
                                   dit(latents[:1], t[:1], uncond), **TOLERANCE)
        assert torch.equal(stacked.repeat(2).bias, stacked.bias.repeat(2, 1))


def _request() -> GenerationRequest:
    return GenerationRequest("p", negative_prompt="n", height=32, width=32, num_frames=5, num_inference_steps=3,
                             seed=0, sampler="euler", flow_shift=3.0, guidance_scale=5.0)


def _slots(prompt: torch.Tensor, negative: torch.Tensor) -> dict:
    return {"request": _request(), "latents": _latents(), "prompt_embeds": prompt, "negative_embeds": negative,
            "image_embeds": None}


@pytest.mark.parametrize("policy", [SequentialCFG(), BatchedCFG()], ids=["sequential", "batched"])
def test_the_loop_denoises_alike_with_collapsed_padding(policy):
    """The whole loop: collapsed prepared prompts against the per-step projection of all 128 rows."""
    dit = _dit()
    results = []
    for prepare in (True, False):
        loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, policy, prepare_prompts=prepare)
        with torch.inference_mode():
            state = loop.init(_slots(_prompt(6), _prompt(30, 2)), None)  # type: ignore[arg-type]
            while (plan := loop.next(state)) is not DONE:
                if prepare:
                    assert plan.inputs["prompt_embeds"].keys[0].shape[1] == 16
                loop.advance(state, plan.call(**plan.inputs))
            results.append(loop.finalize(state)["latents"])
    torch.testing.assert_close(results[0], results[1], **TOLERANCE)


def test_requests_of_different_prompt_lengths_batch_in_one_forward():
    """runtime.batching: collapsed prompts batch whatever their kept key counts (stack pads with masked filler)."""
    dit = _dit()
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, BatchedCFG())
    plans, alone = [], []
    with torch.inference_mode():
        for real in (4, 50):
            state = loop.init(_slots(_prompt(real, real), _prompt(2, 7)), None)  # type: ignore[arg-type]
            plan = loop.next(state)
            plans.append(plan)
            alone.append(plan.call(**plan.inputs))
        assert plans[0].inputs["prompt_embeds"].keys[0].shape[1] != plans[1].inputs["prompt_embeds"].keys[0].shape[1]
        assert repr(plans[0].inputs["prompt_embeds"]) == repr(plans[1].inputs["prompt_embeds"])  # cfg-parallel lockstep
        assert batching.batch_key(plans[0]) == batching.batch_key(plans[1]) is not None
        together = batching.run_batched(plans)
    for got, want in zip(together, alone):
        torch.testing.assert_close(got, want, **TOLERANCE)


def test_the_deployment_decides_whether_padding_collapses():
    """flash/sage take no mask, --compile specialises its blocks on the key count: every key kept; SDPA (and its
    math kernel): multiples of 16."""
    assert padding_key_multiple(DeployConfig()) == padding_key_multiple(DeployConfig(attention_backend="math")) == 16
    for kept_all in (DeployConfig(attention_backend="flash"), DeployConfig(attention_backend="sage"),
                     DeployConfig(compile=True)):
        assert padding_key_multiple(kept_all) is None


class _Capturing:
    captures_steps = True


def test_captured_runs_pad_collapsed_keys_to_their_bucket():
    """Under CUDA graphs (LoopContext.captures_steps) the prepared prompts are padded with masked filler to the
    64-key bucket, so prompts of 6 and 40 real tokens share one captured step; the result is unchanged."""
    dit = _dit()
    loop = WanDenoiseLoop(dit, SamplerConfig(), torch.float32, BatchedCFG())
    assert prompt_bucket(_Capturing()) == PROMPT_BUCKET and prompt_bucket(None) is None  # type: ignore[arg-type]
    with torch.inference_mode():
        outputs = []
        for ctx in (None, _Capturing()):
            state = loop.init(_slots(_prompt(6), _prompt(40, 2)), ctx)  # type: ignore[arg-type]
            plan = loop.next(state)
            kv = plan.inputs["prompt_embeds"]
            assert kv.keys[0].shape[1] == (PROMPT_BUCKET if ctx else 16)
            assert plan.inputs["negative_embeds"].keys[0].shape[1] == (PROMPT_BUCKET if ctx else 48)
            outputs.append(plan.call(**plan.inputs))
        unpadded = dit.prepare_prompt(_prompt(TEXT - 2))  # no bias: nothing to bucket, its own count kept
        assert unpadded.bias is None and unpadded.bucketed(PROMPT_BUCKET) is unpadded
    torch.testing.assert_close(outputs[1], outputs[0], **TOLERANCE)
