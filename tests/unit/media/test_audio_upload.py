"""Uploaded audio: the declared format enforced before any demuxer runs, the header's length refusing before any
decoding, and refusals keeping their own words (#40)."""

from __future__ import annotations

import numpy as np
import pytest

import vidloom.media.audio_upload as audio_upload
from tests.helpers.audio_containers import encoded_audio
from tests.helpers.wav import pcm16_wav
from vidloom.core.errors import InvalidRequest
from vidloom.media.audio_upload import load_input_audio, open_audio_upload

OTHER_CONTAINERS = ("flac", "opus", "m4a", "adts", "mp4_video")


@pytest.fixture
def no_probe(monkeypatch):
    """Call it (after encoding the input) to make av.open fail: a refusal that still comes out ran before any
    demuxer."""
    import av

    def refuse(*args, **kwargs):
        raise AssertionError("a demuxer was opened")

    return lambda: monkeypatch.setattr(av, "open", refuse)


@pytest.mark.parametrize("declared", ["wav", "mp3"])
@pytest.mark.parametrize("name", OTHER_CONTAINERS)
def test_input_audio_in_another_container_is_refused_before_any_demuxer(name, declared, no_probe):
    data = encoded_audio(name)
    no_probe()
    with pytest.raises(InvalidRequest, match=f"does not start like a {declared} file") as info:
        load_input_audio(data, declared, "messages[0].content[0].input_audio")
    assert info.value.field == "messages[0].content[0].input_audio"


def test_a_wav_and_an_mp3_labelled_each_other_are_refused(no_probe):
    wav, mp3 = encoded_audio("wav"), encoded_audio("mp3")
    no_probe()
    with pytest.raises(InvalidRequest, match="does not start like a mp3 file"):
        load_input_audio(wav, "mp3", "f")
    with pytest.raises(InvalidRequest, match="does not start like a wav file"):
        load_input_audio(mp3, "wav", "f")


def test_a_wav_holding_mp3_data_is_refused_by_its_codec():
    with pytest.raises(InvalidRequest, match="holds 'mp3float' data; a wav upload may hold pcm_"):
        load_input_audio(encoded_audio("wav_holding_mp3"), "wav", "f")


@pytest.mark.parametrize("name", ["wav", "mp3"])
def test_input_audio_in_its_declared_format_decodes(name):
    samples = load_input_audio(encoded_audio(name, seconds=0.5), name, "f")
    assert abs(samples.shape[0] - 8000) <= 1200  # MP3 adds encoder padding


@pytest.mark.parametrize("name", ["wav", "mp3", "flac", "opus"])
def test_init_audio_takes_wav_flac_mp3_and_ogg(name):
    rate = 48000 if name == "opus" else 16000
    samples = open_audio_upload(encoded_audio(name, seconds=0.5), "init_audio", rate, 10.0)
    assert samples.shape[0] == 1 and samples.shape[1] >= rate // 2


@pytest.mark.parametrize("name", ["m4a", "adts", "mp4_video"])
def test_init_audio_in_another_container_is_refused_before_any_demuxer(name, no_probe):
    data = encoded_audio(name)
    no_probe()
    with pytest.raises(InvalidRequest, match="is not a readable audio file .*none of the wav, flac, mp3, ogg") as info:
        open_audio_upload(data, "init_audio", 16000, 10.0)
    assert info.value.field == "init_audio"


def test_input_audio_length_is_refused_from_the_header_with_decoding_made_to_fail(monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(audio_upload, "_resampled", no_decoding)
    wav = pcm16_wav(np.zeros(32000, np.int16), 16000)
    with pytest.raises(InvalidRequest) as info:
        load_input_audio(wav, "wav", "f", max_seconds=1.0)
    assert str(info.value) == ("f: its header says it lasts 2.000 s; this server takes at most 1 s "
                               "(MAX_INPUT_AUDIO_SECONDS)")


def test_init_audio_length_is_refused_from_the_header_with_decoding_made_to_fail(monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(audio_upload, "decode_audio_stream", no_decoding)
    with pytest.raises(InvalidRequest, match="its header says it lasts 2.000 s; .* at most 1 s "
                                             r"\(max_init_audio_seconds\)"):
        open_audio_upload(encoded_audio("flac", seconds=2.0), "init_audio", 16000, 1.0)


def test_an_over_long_file_without_a_header_duration_keeps_its_words(monkeypatch):
    """Refused by the running count (the header said nothing), as itself: not "is not a readable wav file"."""
    monkeypatch.setattr(audio_upload, "_header_seconds", lambda container: None)
    wav = pcm16_wav(np.zeros(32000, np.int16), 16000)
    with pytest.raises(InvalidRequest) as info:
        load_input_audio(wav, "wav", "f", max_seconds=1.0)
    assert "readable" not in str(info.value)
    assert "lasts" in str(info.value) and "(MAX_INPUT_AUDIO_SECONDS)" in str(info.value)


def test_a_file_without_an_audio_stream_says_so(monkeypatch):
    class NoStreams:
        audio = ()

    class Container:
        streams = NoStreams()

        def close(self):
            pass

    import av

    wav = encoded_audio("wav")
    monkeypatch.setattr(av, "open", lambda *a, **k: Container())
    with pytest.raises(InvalidRequest) as info:
        load_input_audio(wav, "wav", "f")
    assert str(info.value) == "f: has no audio stream"


def test_unreadable_data_names_no_path():
    with pytest.raises(InvalidRequest, match="is not a readable mp3 file") as info:
        load_input_audio(b"ID3" + bytes(40), "mp3", "f")
    assert "/" not in str(info.value) and "<none>" not in str(info.value)
