"""HunyuanVideo-1.5 transformer parity: our Hunyuan15Transformer vs diffusers' HunyuanVideo15Transformer3DModel,
one forward in float32 on two tiny configs, with padded text, with and without glyph and image tokens."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.graph_capturer import UNCAPTURABLE, OpLog
from tests.helpers.hunyuan15_checkpoints import TINY_TRANSFORMERS, save_transformer
from vidloom.families.hunyuan15.load import load_transformer
from vidloom.families.hunyuan15.transformer import ConditionCounts

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


@pytest.mark.parametrize("name", sorted(TINY_TRANSFORMERS))
@pytest.mark.parametrize(("image", "glyph"), [(False, False), (True, True)], ids=["t2v", "i2v-glyph"])
def test_host_counts_forward_equals_the_mask_forward(name, image, glyph, tmp_path):
    """Given the valid counts on the host (what the denoise loop passes, and a CUDA graph captures), the forward
    slices where the mask-read forward indexes: the same prediction bit for bit, with no op a graph cannot hold,
    where reading the masks does need the device (the padded batch keeps its key mask both ways)."""
    save_transformer(name, tmp_path)
    ours = load_transformer(tmp_path, torch.device("cpu"), torch.float32)
    inputs = _inputs(TINY_TRANSFORMERS[name], image, glyph)
    counts = ConditionCounts(tuple(inputs["encoder_attention_mask"].sum(1).tolist()),
                             tuple(inputs["encoder_attention_mask_2"].sum(1).tolist()))
    timestep_r = torch.tensor([700.0, 100.0]) if TINY_TRANSFORMERS[name].get("use_meanflow") else None
    args = (inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"],
            inputs["encoder_attention_mask"], inputs["encoder_hidden_states_2"], inputs["encoder_attention_mask_2"],
            inputs["image_embeds"] if image else None, timestep_r)
    with torch.no_grad(), OpLog() as from_masks:
        want = ours(*args)
    with torch.no_grad(), OpLog() as from_counts:
        got = ours(*args, counts=counts)
    assert torch.equal(got, want)
    assert from_masks.ops & UNCAPTURABLE  # the mask path's device reads are visible to the log
    assert any("scaled_dot_product" in op for op in from_counts.ops)  # the whole forward was seen
    assert not from_counts.ops & UNCAPTURABLE, sorted(from_counts.ops & UNCAPTURABLE)
    with pytest.raises(ValueError, match="counts.text"):
        ours(*args, counts=ConditionCounts((8, 7), counts.glyph))  # more valid rows than the 7 given


@pytest.mark.parametrize("name", sorted(TINY_TRANSFORMERS))
@pytest.mark.parametrize(("image", "glyph"), [(False, False), (True, True)], ids=["t2v", "i2v-glyph"])
def test_padded_forward_masks_the_padding_keys(name, image, glyph, tmp_path):
    """Bucket-padded prompts (the --cuda-graphs path: `padded`) keep every condition row and mask the padding keys,
    as the reference masks its own padding: the prediction equals the mask-read forward (which equals diffusers')
    within TOLERANCE whatever the padding rows hold (here large random values), with no op a graph cannot hold
    (measured: max abs <= 4.8e-7 against outputs of magnitude about 2)."""
    save_transformer(name, tmp_path)
    ours = load_transformer(tmp_path, torch.device("cpu"), torch.float32)
    inputs = _inputs(TINY_TRANSFORMERS[name], image, glyph)
    g = torch.Generator().manual_seed(5)
    for states, mask in (("encoder_hidden_states", "encoder_attention_mask"),
                         ("encoder_hidden_states_2", "encoder_attention_mask_2")):
        garbage = 100 * torch.randn(inputs[states].shape, generator=g)
        inputs[states] = torch.where(inputs[mask].bool()[..., None], inputs[states], garbage)
    timestep_r = torch.tensor([700.0, 100.0]) if TINY_TRANSFORMERS[name].get("use_meanflow") else None
    args = (inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"],
            inputs["encoder_attention_mask"], inputs["encoder_hidden_states_2"], inputs["encoder_attention_mask_2"],
            inputs["image_embeds"] if image else None, timestep_r)
    with torch.no_grad():
        want = ours(*args)
        with OpLog() as log:
            got = ours(*args, padded=True)
    assert got.shape == want.shape and (got - want).abs().max() <= TOLERANCE * want.abs().max()
    assert any("scaled_dot_product" in op for op in log.ops)
    assert not log.ops & UNCAPTURABLE, sorted(log.ops & UNCAPTURABLE)
