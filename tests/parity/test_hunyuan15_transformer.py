"""HunyuanVideo-1.5 transformer parity: our Hunyuan15Transformer vs diffusers' HunyuanVideo15Transformer3DModel,
one forward in float32 on two tiny configs, with padded text, with and without glyph and image tokens."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.hunyuan15_checkpoints import TINY_TRANSFORMERS, save_transformer
from vidloom.families.hunyuan15.load import load_transformer

TOLERANCE = 1e-5  # measured <= 5e-7


def _inputs(cfg: dict, image: bool, glyph: bool, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch, frames, h, w = 2, 4, 4, 6
    text_len, glyph_len, image_len = 7, 5, 6
    text_mask = torch.ones(batch, text_len, dtype=torch.long)
    text_mask[0, 5:] = 0  # the prompts keep different numbers of tokens
    glyph_mask = torch.zeros(batch, glyph_len, dtype=torch.long)
    if glyph:
        glyph_mask[1, :3] = 1  # one prompt quotes text, the other does not
    return dict(
        hidden_states=torch.randn(batch, cfg["in_channels"], frames, h, w, generator=g),
        timestep=torch.tensor([937.5, 412.25]),
        encoder_hidden_states=torch.randn(batch, text_len, cfg["text_embed_dim"], generator=g),
        encoder_attention_mask=text_mask,
        encoder_hidden_states_2=torch.randn(batch, glyph_len, cfg["text_embed_2_dim"], generator=g) * glyph_mask[..., None],
        encoder_attention_mask_2=glyph_mask,
        image_embeds=(torch.randn(batch, image_len, cfg["image_embed_dim"], generator=g) if image
                      else torch.zeros(batch, image_len, cfg["image_embed_dim"])),
    )


def _ours(model, inputs: dict, image: bool, timestep_r=None):
    return model(inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"],
                 inputs["encoder_attention_mask"], inputs["encoder_hidden_states_2"],
                 inputs["encoder_attention_mask_2"], inputs["image_embeds"] if image else None, timestep_r)


@pytest.mark.parametrize("name", sorted(TINY_TRANSFORMERS))
@pytest.mark.parametrize(("image", "glyph"), [(False, False), (False, True), (True, True)],
                         ids=["t2v", "t2v-glyph", "i2v-glyph"])
def test_forward_matches_diffusers(name, image, glyph, tmp_path):
    ref = save_transformer(name, tmp_path)
    ours = load_transformer(tmp_path, torch.device("cpu"), torch.float32)
    inputs = _inputs(TINY_TRANSFORMERS[name], image, glyph)
    timestep_r = torch.tensor([700.0, 100.0]) if ref.config.use_meanflow else None
    with torch.no_grad():
        expected = ref(**inputs, timestep_r=timestep_r, return_dict=False)[0]
        got = _ours(ours, inputs, image, timestep_r)
    assert got.shape == expected.shape
    assert torch.isfinite(expected).all()
    diff = (got - expected).abs().max().item()
    assert diff < TOLERANCE, diff


def test_conditioning_paths_move_the_output(tmp_path):
    # Parity alone could pass with an inert path: text, glyph and image tokens each change the prediction.
    save_transformer("p1", tmp_path)
    ours = load_transformer(tmp_path, torch.device("cpu"), torch.float32)
    plain = _inputs(TINY_TRANSFORMERS["p1"], image=False, glyph=False)
    with torch.no_grad():
        base = _ours(ours, plain, image=False)
        glyphs = _ours(ours, _inputs(TINY_TRANSFORMERS["p1"], image=False, glyph=True), image=False)
        images = _ours(ours, _inputs(TINY_TRANSFORMERS["p1"], image=True, glyph=False), image=True)
        other_text = dict(plain, encoder_hidden_states=plain["encoder_hidden_states"].flip(1))
        texts = _ours(ours, other_text, image=False)
    for changed, reference in ((glyphs[1], base[1]), (images[0], base[0]), (texts[0], base[0])):
        assert (changed - reference).abs().max().item() > 1e-3
