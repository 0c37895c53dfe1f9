"""`vidloom generate`'s option flags come from the families' option blocks: one --help group per block, values
typed by kind (arrays from text or files), and a flag the model's card lacks refused naming it, with the reason."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from vidloom import registry
from vidloom.cli import build_parser
from vidloom.cli.options import option_flags, option_values
from vidloom.core.errors import InvalidRequest
from vidloom.generator import build_request


def _generate_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["generate", "--prompt", "a road", *flags])


def test_every_declared_option_is_a_flag_in_its_blocks_help_group():
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    groups = {group.title: {opt for action in group._group_actions for opt in action.option_strings}
              for group in sub.choices["generate"]._action_groups}
    for block, families in registry.option_blocks().values():
        flags = {option.cli_flag for option in block.options if option.cli}
        if flags:
            assert groups[f"{block.name} options ({', '.join(families)})"] == flags
    assert option_flags()["guidance_scale_2"] == "--guidance-2"


def test_values_are_typed_and_arrays_read_from_text_or_files(tmp_path):
    poses = tmp_path / "poses.npy"
    np.save(poses, np.eye(4)[None].repeat(2, 0))
    (tmp_path / "k.json").write_text(json.dumps([[60, 0, 40], [0, 60, 24], [0, 0, 1]]))
    values = option_values(_generate_args("--c2w", str(poses), "--intrinsics", str(tmp_path / "k.json"),
                                          "--seconds", "2.5", "--reason"))
    assert values["c2w"].shape == (2, 4, 4) and values["intrinsics"][2] == [0, 0, 1]
    assert values["seconds"] == 2.5 and values["reason"] is True and "camera" not in values
    assert option_values(_generate_args("--intrinsics", "60,60,40,24"))["intrinsics"] == [60, 60, 40, 24]
    with pytest.raises(InvalidRequest) as bad:
        option_values(_generate_args("--intrinsics", "sixty"))
    assert bad.value.field == "intrinsics"
    with pytest.raises(SystemExit):  # argparse types the numbers
        _generate_args("--seconds", "long")


def test_a_flag_the_models_card_lacks_is_refused_with_the_reason():
    card = registry.resolve_card("wan2.1-demo")
    with pytest.raises(InvalidRequest) as refused:
        build_request(card, "a road", **option_values(_generate_args("--camera", "w-8")))
    assert refused.value.field == "camera" and "not a camera-controlled world model" in refused.value.message
    assert build_request(card, "a road", **option_values(_generate_args("--strength", "0.5"))).option("strength") == 0.5
