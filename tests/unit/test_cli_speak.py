"""`vidloom speak`: the output's suffix picks the format, refusals name the flag, the file decodes."""

from __future__ import annotations

import av
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from vidloom import cli


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)


def test_speak_writes_the_format_of_the_suffix(omni_dir, tmp_path, capsys):
    out = tmp_path / "kite.flac"
    code = cli.main(["speak", "--model", str(omni_dir), "--voice", "Ethan", "--seed", "3", "--max-audio-tokens", "8",
                     "the kite rose", "-o", str(out)])
    assert code == 0
    with av.open(str(out)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "flac" and stream.rate == 24000
        assert sum(f.samples for f in container.decode(stream)) > 0
    assert "voice Ethan" in capsys.readouterr().out


def test_unknown_voice_is_named(omni_dir, tmp_path, capsys):
    code = cli.main(["speak", "--model", str(omni_dir), "--voice", "Alloy", "hello", "-o", str(tmp_path / "a.wav")])
    assert code != 0
    err = capsys.readouterr().err
    assert "voice" in err and "Chelsie, Ethan" in err


def test_unknown_suffix_is_refused_before_loading(tmp_path, capsys):
    code = cli.main(["speak", "--model", str(tmp_path / "nowhere"), "hello", "-o", str(tmp_path / "a.ogg")])
    assert code != 0 and ".wav" in capsys.readouterr().err and not (tmp_path / "a.ogg").exists()
