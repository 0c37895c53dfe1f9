"""LTX2Network's per-request reuse (rotary tables), its prepared text K/V (once per request and CFG branch, through
the loop's PreparedPrompts) and the loop's idle-STG rule."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers.freed_blocks import FreedBlock
from vidloom.diffusion.av_guidance import AudioVideoGuidance, AudioVideoScales
from vidloom.lora.apply import ActiveLoRAs, lora_scope
from vidloom.models.ltx2.rope import audio_positions, video_positions
from vidloom.models.ltx2.transformer import LTX2Positions, LTX2PreparedText, LTX2Transformer, LTX2TransformerConfig
from vidloom.families.ltx2.loop import LTX2DenoiseLoop, LTX2Layout, LTX2Network
from vidloom.models.ltx2.text import LTX2Text

# A tiny LTX-2.0-style transformer (static text modulation, learnable-register text: every token attended).
CONFIG = LTX2TransformerConfig(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
    audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
    audio_cross_attention_dim=8, num_layers=2, caption_channels=8)
FRAMES, HEIGHT, WIDTH, AUDIO, TEXT = 2, 2, 3, 5, 6


def _transformer(config: LTX2TransformerConfig = CONFIG) -> LTX2Transformer:
    torch.manual_seed(0)
    dit = LTX2Transformer(config).eval()
    with torch.no_grad():
        for name, p in dit.named_parameters():
            if "table" in name:
                p.normal_(0, 0.5)
    return dit


def _layout(c: LTX2TransformerConfig) -> LTX2Layout:
    cpu = torch.device("cpu")
    positions = LTX2Positions(
        video_positions(1, FRAMES, HEIGHT, WIDTH, patch_t=1, patch=1, scale=c.vae_scale_factors,
                        causal_offset=c.causal_offset, fps=24.0, device=cpu),
        audio_positions(1, AUDIO, patch_t=1, scale=c.audio_scale_factor, causal_offset=c.causal_offset,
                        hop_length=c.audio_hop_length, sample_rate=c.audio_sampling_rate, device=cpu))
    return LTX2Layout(FRAMES, HEIGHT, WIDTH, AUDIO, positions, 24.0)


def _text(seed: int, keep: int = TEXT) -> LTX2Text:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(1, TEXT, dtype=torch.int64)
    mask[:, TEXT - keep:] = 1
    return LTX2Text(torch.randn(1, TEXT, CONFIG.caption_channels, generator=g),
                    torch.randn(1, TEXT, CONFIG.caption_channels, generator=g), mask)


def _inputs(batch: int):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(batch, FRAMES * HEIGHT * WIDTH, 4, generator=g), torch.randn(batch, AUDIO, 4, generator=g),
            torch.full((batch,), 700.0), torch.full((batch,), 700.0))


@pytest.mark.parametrize("keep", [TEXT, 4])
def test_prepared_text_and_reused_tables_give_the_plain_forward(keep):
    """Each branch's prepared K/V (LTX2Network.prepare_prompt, stacked for the CFG pair as the guidance stacks the
    texts) and the cached tables match a forward that builds everything itself (what the steps ran before the
    text was prepared): bit for bit for one prompt, within 1e-6 for the pair (each branch projected on its own row
    vs both rows in one GEMM); a partial mask is kept, a full one elided."""
    dit = _transformer()
    layout = _layout(CONFIG)
    prompt, negative = _text(2, keep), _text(3, keep)
    reusing = LTX2Network(dit, layout.positions, torch.float32, True)
    plain = reusing.graph_rebuild((layout.positions,))
    assert not plain.reuse
    with torch.no_grad():  # as the loop prepares them: the fused caption GELU (layers.fused_linear) runs without autograd
        prepared = [reusing.prepare_prompt(negative), reusing.prepare_prompt(prompt)]
    assert all(isinstance(p, LTX2PreparedText) and (p.mask is None) == (keep == TEXT) for p in prepared)
    video, audio, t, at = _inputs(2)
    with torch.no_grad():
        for _ in range(2):  # the second call finds the tables the first built
            got = reusing(video, audio, prepared[0].cat(prepared[1]), t, at)
            want = plain(video, audio, negative.cat(prompt), t, at)
            assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(got, want))
            alone = reusing(video[1:], audio[1:], prepared[1], t[1:], at[1:], isolate=True)
            want = plain(video[1:], audio[1:], prompt, t[1:], at[1:], isolate=True)
            assert all(torch.equal(a, b) for a, b in zip(alone, want))
    assert set(reusing._ropes) == {1, 2}


def test_the_loop_prepares_each_branch_once_under_its_adapters():
    """The loop's PreparedPrompts (diffusion.prompt_kv) prepares the prompt and the negative once for the request,
    again under another adapter set; LTX-2.3's prompt AdaLN (text K/V that change with the timestep) prepares
    nothing and its steps read the text."""
    dit = _transformer()
    loop = LTX2DenoiseLoop("stage1", dit, torch.float32, lambda r, n: torch.linspace(1.0, 0.0, 4),
                           lambda r: AudioVideoScales(), use_cross_timestep=True, guidance=AudioVideoGuidance())
    video, audio, _, _ = _inputs(1)
    slots = {"request": None, "layout": _layout(CONFIG), "video_latents": video, "audio_latents": audio,
             "prompt_text": _text(2, 4), "negative_text": _text(3, 4)}
    with torch.no_grad():
        state = loop.init(slots, None)  # type: ignore[arg-type]
        plans = [loop.next(state) for _ in range(2)]
        assert all(isinstance(p.inputs["prompt"], LTX2PreparedText) for p in plans)
        assert plans[0].inputs["negative"] is plans[1].inputs["negative"] and state.prompts.prepared == 2
        with lora_scope(ActiveLoRAs({})):
            loop.next(state)
        assert state.prompts.prepared == 4
    modulated = _transformer(dataclasses.replace(CONFIG, cross_attn_mod=True))
    assert not modulated.static_text
    net = LTX2Network(modulated, _layout(CONFIG).positions, torch.float32, True)
    assert net.prepare_prompt(_text(2)) is None


@pytest.mark.parametrize(("perturbed", "blocks", "runs_stg"), [(False, (1,), False), (True, (28,), False),
                                                              (True, (1,), True)])
def test_the_stg_pass_runs_only_where_it_perturbs_a_block(perturbed, blocks, runs_stg):
    """An STG pass that perturbs nothing equals the conditional pass: the loop drops its (zero) term."""
    config = dataclasses.replace(CONFIG, perturbed_attn=perturbed)
    dit = _transformer(config)
    loop = LTX2DenoiseLoop("stage1", dit, torch.float32, lambda r, n: torch.linspace(1.0, 0.0, 3),
                           lambda r: AudioVideoScales(stg_blocks=blocks), use_cross_timestep=True,
                           guidance=AudioVideoGuidance())
    video, audio, _, _ = _inputs(1)
    state = loop.init({"request": None, "layout": _layout(config), "video_latents": video, "audio_latents": audio,
                       "prompt_text": _text(2), "negative_text": _text(3)}, None)
    assert state.scales.stg == runs_stg
    assert state.scales.video_modality == 3.0 and state.scales.video_cfg == 3.0  # the other passes are kept


def test_prepared_text_gathers_each_sharded_block_in_turn():
    """--shard-weights frees a block's weights outside its forward: the text K/V are prepared with each block's
    weights gathered in turn (layers.sharded) and equal the unsharded ones; the blocks end freed again (seen failing
    as a read of freed storage in bench/parallel_families.py ltx2-mid sp2shard)."""
    dit = _transformer()
    network = LTX2Network(dit, _layout(CONFIG).positions, torch.float32, True)
    want = network.prepare_prompt(_text(2))
    shards = [FreedBlock(block) for block in dit.blocks]
    got = network.prepare_prompt(_text(2))
    assert [shard.gathers for shard in shards] == [1] * len(shards)
    assert all(not shard.resident() for shard in shards)
    assert all(torch.equal(a, b) for a, b in zip((*want.video.keys, *want.audio.values),
                                                 (*got.video.keys, *got.audio.values)))
