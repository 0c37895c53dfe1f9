"""HunyuanVideo-1.5 prompt embeddings: our encoder vs HunyuanVideo15Pipeline.encode_prompt (Qwen2.5-VL's
hidden_states[-3] with the system prefix cropped, ByT5 over quoted text, zeros otherwise), valid tokens compared."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.hunyuan15_checkpoints import save_text_encoders, system_turn_tokens
from vidloom.families.hunyuan15.text import SYSTEM_MESSAGE, Hunyuan15TextEncoder, glyph_text

TOLERANCE = 1e-5  # measured <= 9e-7 (glyph), 1e-8 (text)
PROMPTS = ("a red fox jumps over the lazy dog", 'a cat holding a sign that says "hello world" and \u201cmoon\u201d',
           "", 'a sign: "a", "b", "a"')


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    from diffusers import HunyuanVideo15Pipeline

    default = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters["system_message"].default
    assert default == SYSTEM_MESSAGE
    HUNYUAN_SYSTEM = default

    folder = tmp_path_factory.mktemp("hv15_text")
    parts = save_text_encoders(folder, text_hidden=24, glyph_dim=20)
    ours = Hunyuan15TextEncoder.load(folder, torch.device("cpu"), torch.float32)
    # encode_prompt reads only the text components and these settings (its __init__ needs a VAE).
    # The pipeline crops a fixed 108 (Qwen2.5-VL's own count); the tiny tokenizer's system turn is shorter.
    ref = SimpleNamespace(
        **parts, _get_mllm_prompt_embeds=HunyuanVideo15Pipeline._get_mllm_prompt_embeds,
        _get_byt5_prompt_embeds=HunyuanVideo15Pipeline._get_byt5_prompt_embeds, tokenizer_max_length=1000,
        tokenizer_2_max_length=256, system_message=HUNYUAN_SYSTEM,
        prompt_template_encode_start_idx=system_turn_tokens(parts["tokenizer"]))
    ref.encode_prompt = lambda **kw: HunyuanVideo15Pipeline.encode_prompt(ref, **kw)
    return ours, ref


def test_the_counted_prefix_is_the_system_turn(encoders):
    ours, ref = encoders
    assert ours.crop == ref.prompt_template_encode_start_idx > 40


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_embeddings_match_the_pipeline(encoders, prompt):
    ours, ref = encoders
    with torch.no_grad():
        text, text_mask, glyph, glyph_mask = ref.encode_prompt(prompt=prompt if prompt else None,
                                                               device=torch.device("cpu"), dtype=torch.float32)
    got = ours.encode([prompt])[0]
    valid = text[0][text_mask[0].bool()]
    assert got.text.shape == valid.shape
    assert (got.text - valid).abs().max().item() < TOLERANCE
    valid_glyph = glyph[0][glyph_mask[0].bool()]
    assert got.glyph.shape == valid_glyph.shape
    if glyph_text(prompt) is None:
        assert got.glyph.shape[0] == 0 and not glyph.any()
    else:
        assert (got.glyph - valid_glyph).abs().max().item() < TOLERANCE


def test_a_cached_prompt_skips_the_encoders(encoders):
    ours, _ = encoders
    cached = Hunyuan15TextEncoder(ours.tokenizer, ours.model, ours.glyph_tokenizer, ours.glyph_model,
                                  torch.device("cpu"), cache_size=2)
    first = cached.encode([PROMPTS[1]])[0]
    again = cached.encode([PROMPTS[1]])[0]
    assert (cached.cache.misses, cached.cache.hits) == (1, 1)
    assert torch.equal(first.text, again.text) and torch.equal(first.glyph, again.glyph)
