"""Near misses a new user types: "did you mean" for model ids and flags, and the text given either way (#39)."""

from __future__ import annotations

import pytest

from vidloom import cli, registry
from vidloom.cli import build_parser
from vidloom.cli.prompt_args import take_prompt
from vidloom.core.errors import InvalidRequest, VidloomError


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_unknown_model_suggests_the_close_id():
    with pytest.raises(VidloomError, match=r"unknown model 'wan2.1-dem' \(did you mean 'wan2.1-demo'\?\)"):
        registry.resolve_card("wan2.1-dem")


@pytest.mark.parametrize("argv, meant", [
    (["generate", "--prompt", "a cat", "--num-frames", "5"], "(did you mean --frames?)"),
    (["generate", "--prompt", "a cat", "--num_inference_steps=3"], "(did you mean --steps?)"),
    (["generate", "--prompt", "a cat", "--guidance-scale", "4"], "(did you mean --guidance?)"),
    (["generate", "--prompt", "a cat", "--negativ-promt", "x"], "(did you mean --negative-prompt?)"),
    (["chat", "--model", "m", "--max-new-tokens", "4"], "(did you mean --max-tokens?)"),
    (["speak", "--model", "m", "--promt", "hi"], "(did you mean --prompt?)"),
])
def test_unknown_flag_suggests_the_commands_own(argv, meant, capsys):
    line = _parse_error(argv, capsys)
    assert line.startswith("error: vidloom: unrecognized arguments: ") and line.endswith(meant), line


def test_several_unknown_flags_each_get_theirs(capsys):
    line = _parse_error(["generate", "--prompt", "x", "--num-frames", "5", "--guidance_scale", "3"], capsys)
    assert line.endswith("(did you mean --frames for --num-frames, --guidance for --guidance_scale?)"), line


def test_a_flag_with_no_near_name_gets_no_guess(capsys):
    line = _parse_error(["generate", "--prompt", "x", "--zzzzqq"], capsys)
    assert line == "error: vidloom: unrecognized arguments: --zzzzqq"


@pytest.mark.parametrize("command", [["generate"], ["speak", "--model", "m"]])
def test_generate_and_speak_take_the_text_either_way(command):
    for argv in (command + ["--prompt", "a kite"], command + ["a kite"], command + ["a kite", "--prompt", "a kite"]):
        args = build_parser().parse_args(argv)
        take_prompt(args)
        assert args.prompt == "a kite"
    for argv, says in ((command, "missing"), (command + ["a kite", "--prompt", "a fox"], "given twice")):
        args = build_parser().parse_args(argv)
        with pytest.raises(InvalidRequest, match=says):
            take_prompt(args)


def test_a_missing_prompt_is_one_line_naming_the_flag(capsys):
    assert cli.main(["generate", "-o", "x.mp4"]) == 2
    assert capsys.readouterr().err == "error: --prompt: missing: give the text as --prompt TEXT\n"
