"""NameMap translates checkpoint keys and module names both ways."""

import pytest

from vidloom.loading.name_map import NameMap

MAP = NameMap((
    ("blocks.{n}.attn1.to_q", "blocks.{n}.self_attn.q"),
    ("blocks.{n}.ffn.net.{n}.proj", "blocks.{n}.mlp.fc{n}"),
    ("condition_embedder.time_embedder", "time_embed"),
))


@pytest.mark.parametrize(
    "ckpt, ours",
    [
        ("blocks.12.attn1.to_q.weight", "blocks.12.self_attn.q.weight"),
        ("blocks.0.ffn.net.0.proj.bias", "blocks.0.mlp.fc0.bias"),
        ("condition_embedder.time_embedder.linear_1.weight", "time_embed.linear_1.weight"),
        ("proj_out.weight", "proj_out.weight"),  # no rule: identity
    ],
)
def test_round_trip(ckpt, ours):
    assert MAP.to_module(ckpt) == ours
    assert MAP.to_checkpoint(ours) == ckpt


def test_prefix_matches_whole_segments_only():
    m = NameMap((("blocks.1", "layer_one"),))
    assert m.to_module("blocks.1.w") == "layer_one.w"
    assert m.to_module("blocks.10.w") == "blocks.10.w"


def test_mismatched_placeholders_rejected():
    with pytest.raises(ValueError):
        NameMap((("a.{n}", "b"),))
