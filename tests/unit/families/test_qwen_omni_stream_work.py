"""What streamed speech costs: mel frames the DiT integrates and the vocoder reads, against the whole decode.

Counted on the released checkpoint's geometry (DiT blocks of 24 frames, 2 frames per code, the vocoder's
240-sample hop and its kernels) at tiny widths with random weights: the work depends on those sizes only.
A whole-utterance decode integrates every frame once and vocodes every frame once; streaming in chunks of
25 codes (the server's first chunk) that grow to MAX_CHUNK_CODES reads each frame at most WORK_FACTOR times.
"""

from __future__ import annotations

import pytest
import torch

from vidloom.families.qwen_omni.config import DiTConfig, VocoderConfig
from vidloom.families.qwen_omni.dit import CodeToMelDiT
from vidloom.families.qwen_omni.speakers import Voice
from vidloom.families.qwen_omni.vocoder import BigVGAN, receptive_field
from vidloom.families.qwen_omni import stream_audio
from vidloom.serving.speech_stream import STREAM_CHUNK_CODES

WORK_FACTOR = 1.6  # the stated bound (fixed 25-code chunks read ~2.3x per frame: 2 blocks back, 1 ahead each)
MEL = 16
DIT = DiTConfig.from_raw(dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, head_dim=8, emb_dim=8,
                              look_ahead_layers=[1], look_backward_layers=[0], num_embeds=32, mel_dim=MEL,
                              enc_emb_dim=8, enc_dim=8, enc_channels=[8, 8, 8, 8, 24], enc_attention_channels=4,
                              enc_se_channels=4))  # block_size 24, repeats 2: the released defaults
VOCODER = VocoderConfig.from_raw(dict(mel_dim=MEL, upsample_initial_channel=64))  # released rates and kernels


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    voice = Voice("v", 0, torch.randn(1, DIT.enc_emb_dim), torch.randn(1, 30, MEL))
    return CodeToMelDiT(DIT).eval(), BigVGAN(VOCODER).eval(), voice


def stream_codes(parts, codes: list[int], chunk: int) -> stream_audio.AudioStream:
    """Codes arriving one at a time, each chunk decoded as soon as it is ready (as the talker loop does)."""
    dit, vocoder, voice = parts
    stream = stream_audio.open_stream(dit, vocoder, voice, len(codes), chunk, ode_steps=2, seed=0)
    for n in range(1, len(codes) + 1):
        while stream.ready(n, n == len(codes)):
            stream.add(stream_audio.decode_chunk(**stream.plan_inputs(codes[:n], n == len(codes))))
    return stream


@pytest.mark.parametrize("codes", [150, 500])  # 3 s (the bench's utterance) and 10 s
def test_streaming_reads_each_frame_at_most_the_factor(parts, codes):
    stream = stream_codes(parts, [i % 32 for i in range(codes)], STREAM_CHUNK_CODES)
    frames = codes * DIT.repeats
    assert len(stream.audio()) == frames * VOCODER.hop
    assert stream.chunk_size(0) == STREAM_CHUNK_CODES  # the first audio waits for no more codes than before
    print(f"{codes} codes: DiT {stream.dit_frames / frames:.2f}x, vocoder {stream.vocoder_frames / frames:.2f}x")
    assert stream.dit_frames <= WORK_FACTOR * frames
    assert stream.vocoder_frames <= WORK_FACTOR * frames


def test_fixed_chunks_cost_more(parts, monkeypatch):
    """The counter sees the overlap: without growth every 25 codes pay 2 blocks back and 1 ahead again."""
    monkeypatch.setattr(stream_audio, "CHUNK_GROWTH", 1)
    stream = stream_codes(parts, [i % 32 for i in range(150)], STREAM_CHUNK_CODES)
    assert stream.dit_frames > 2 * 150 * DIT.repeats


def test_the_vocoder_on_a_span_and_its_receptive_field_is_the_whole_mels():
    """receptive_field is an upper bound: a span's samples, vocoded with that margin, equal the whole mel's."""
    torch.manual_seed(1)
    for raw in (dict(mel_dim=MEL, upsample_initial_channel=64),  # released rates and kernels
                dict(mel_dim=MEL, upsample_initial_channel=16, resblock_kernel_sizes=[3, 5, 7],
                     resblock_dilation_sizes=[[1, 3, 5]] * 3, upsample_rates=[3, 2, 2],
                     upsample_kernel_sizes=[6, 4, 4])):
        config = VocoderConfig.from_raw(raw)
        vocoder, reach, hop = BigVGAN(config).eval(), receptive_field(config), config.hop
        for p in vocoder.parameters():  # small weights: no clamping at +-1, so every frame moves the output
            torch.nn.init.normal_(p, std=0.05)
        mel = torch.randn(1, MEL, 3 * reach + 10)
        start, stop = reach + 3, 2 * reach + 7
        with torch.inference_mode():
            whole = vocoder(mel)[0]
            span = vocoder(mel[:, :, start - reach:stop + reach])[0][reach * hop:(reach + stop - start) * hop]
            moved = mel.clone()
            moved[:, :, start - reach - 1] += 1.0  # a frame just outside the margin
            outside = vocoder(moved)[0][start * hop:stop * hop]
        torch.testing.assert_close(span, whole[start * hop:stop * hop], atol=1e-6, rtol=0)  # summation order
        torch.testing.assert_close(outside, whole[start * hop:stop * hop], atol=1e-6, rtol=0)
