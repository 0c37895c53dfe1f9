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


def test_chat_with_a_voice_writes_each_answer(omni_dir, tmp_path, capsys):
    import io
    import wave

    from vidloom.cli import build_parser
    from vidloom.cli.chat import chat_command

    args = build_parser().parse_args(["chat", "--model", str(omni_dir), "--voice", "Ethan", "--temperature", "0",
                                      "--max-tokens", "6", "--audio-dir", str(tmp_path / "audio")])
    out = io.StringIO()
    assert chat_command(args, stdin=io.StringIO("what is a kite?\nhello\n"), stdout=out) == 0
    files = sorted((tmp_path / "audio").glob("reply-*.wav"))
    assert [f.name for f in files] == ["reply-001.wav", "reply-002.wav"]
    with wave.open(str(files[0])) as w:
        assert w.getframerate() == 24000
    # one line per answer ("\n"-ended; a random reply may hold \x1d, which str.splitlines also splits at)
    assert "spoken:" in capsys.readouterr().err and out.getvalue().count("\n") == 2


def test_generator_chat_aloud_speaks_the_greedy_reply(omni_dir):
    from vidloom.generator import VideoGenerator

    gen = VideoGenerator.from_pretrained(str(omni_dir))
    messages = [{"role": "user", "content": "what is a kite?"}]
    spoken = gen.chat(messages, audio={"voice": "Chelsie", "max_audio_tokens": 6}, temperature=0, max_tokens=6)
    # Spoken, the chat is led by the model card's documented system prompt; written, it is not.
    system = {"role": "system", "content": gen.card.spoken_system_prompt}
    assert spoken.text == gen.chat([system, *messages], temperature=0, max_tokens=6).text
    assert spoken.text != gen.chat(messages, temperature=0, max_tokens=6).text
    assert spoken.sample_rate == 24000 and 0 < spoken.audio_tokens <= 6
