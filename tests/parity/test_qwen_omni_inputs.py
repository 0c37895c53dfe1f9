"""Qwen2.5-Omni audio and image inputs: our thinker (and talker, token2wav) vs transformers, float32 CPU.

The reference is driven as its processor would drive it: Whisper features padded to chunk_length, Qwen2-VL
patches, each placeholder widened to its tower's token count. Greedy thinker ids must equal
`thinker.generate` (text answers) and `generate(generation_mode="audio")` (spoken answers, with the talker's
codes and the waveform). transformers 5.24's generate() hands every unprefixed keyword to the talker too, and
its talker refuses `pixel_values`: the pixels go in as `thinker_pixel_values` (the talker still gets the grid).
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_CONFIGS, load_reference, processors, write_tiny_omni
from tests.helpers.wav import pcm16_wav
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.core.chat import SamplingParams
from vidloom.generator import VideoGenerator
from vidloom.families.qwen_omni.encoders import audio_output_length

THINKER_TOKENS, TALKER_TOKENS, SEED = 8, 16, 5
WAVE_ATOL = 1e-4  # as test_qwen_omni_speech: summation-order noise through the DiT and the vocoder
GREEDY = SamplingParams(temperature=0.0)


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    return pcm16_wav(np.clip(samples * 32768, -32768, 32767).astype(np.int16), rate)


def png_url(seed: int, size: tuple[int, int]) -> tuple[str, object]:
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode(), image


def clip(seed: int, seconds: float) -> tuple[dict, np.ndarray]:
    """An input_audio part and the samples our decoder must read from it (16-bit PCM)."""
    # tones at seed-dependent pitches under a swell (white noise of any seed has the same spectrum)
    rng = np.random.RandomState(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    tones = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 4000, size=3))
    samples = (0.2 * tones * np.sin(np.pi * t / seconds) ** 2 + 0.02 * rng.randn(t.shape[0])).astype(np.float32)
    data = wav_bytes(samples)
    pcm = np.frombuffer(data[44:], dtype=np.int16).astype(np.float32) / 32768
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    return part, pcm


@pytest.fixture(scope="module", params=OMNI_CONFIGS, ids=lambda spec: spec.name)
def omni(request, tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp(request.param.name), request.param)
    return folder, load_reference(folder), VideoGenerator.from_pretrained(str(folder))


def conversation(seed: int):
    """Audio, text and an image in one user turn: (our messages, the reference's inputs)."""
    audio_part, pcm = clip(seed, 1.3)
    url, image = png_url(seed, (90, 70))
    ours = [{"role": "user", "content": [audio_part, {"type": "text", "text": "what is a kite?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]
    return ours, pcm, image


def reference_inputs(tokenizer, pcm: np.ndarray, image, system: str | None = None) -> dict:
    extractor, image_processor = processors()
    feats = extractor(pcm, sampling_rate=16000, padding="max_length", return_attention_mask=True, return_tensors="pt")
    pix = image_processor(images=[image], return_tensors="pt")
    audio_tokens = audio_output_length(int(feats["attention_mask"].sum()))
    image_tokens = int(pix["image_grid_thw"].prod()) // 4
    # the processor's way: the template renders one placeholder per part, then each is widened
    parts = [{"type": "audio"}, {"type": "text", "text": "what is a kite?"}, {"type": "image"}]
    turns = [{"role": "system", "content": system}] if system is not None else []
    text = tokenizer.apply_chat_template([*turns, {"role": "user", "content": parts}], tokenize=False,
                                         add_generation_prompt=True)
    text = text.replace("<|AUDIO|>", "<|AUDIO|>" * audio_tokens).replace("<|IMAGE|>", "<|IMAGE|>" * image_tokens)
    ids = tokenizer(text, return_tensors="pt")
    return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"],
            "input_features": feats["input_features"], "feature_attention_mask": feats["attention_mask"],
            "pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"]}


def test_text_answer_matches_thinker_generate(omni):
    folder, model, gen = omni
    tokenizer = gen.engine.instance["tokenizer"]
    messages, pcm, image = conversation(1)
    result = gen.chat(messages, max_tokens=THINKER_TOKENS, temperature=0.0)
    inputs = reference_inputs(tokenizer, pcm, image)
    out = model.thinker.generate(**inputs, max_new_tokens=THINKER_TOKENS, do_sample=False,
                                 eos_token_id=[tokenizer.eos_token_id])
    expected = out[0, inputs["input_ids"].shape[1]:].tolist()
    assert list(result.token_ids) == expected
    assert result.prompt_tokens == inputs["input_ids"].shape[1]
    # the towers matter: another clip and image change the answer
    other, _, _ = conversation(2)
    assert list(gen.chat(other, max_tokens=THINKER_TOKENS, temperature=0.0).token_ids) != expected
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_spoken_answer_matches_generate(omni):
    folder, model, gen = omni
    tokenizer = gen.engine.instance["tokenizer"]
    tokens = gen.engine.instance["talker_tokens"]
    messages, pcm, image = conversation(3)  # a conversation after which both tiny talkers speak a while
    result = gen.chat(messages, audio={"voice": "Chelsie", "max_audio_tokens": TALKER_TOKENS, "greedy": True},
                      max_tokens=THINKER_TOKENS, temperature=0.0, seed=SEED)
    inputs = reference_inputs(tokenizer, pcm, image, SPOKEN_SYSTEM_PROMPT)  # ours adds it to a spoken chat
    seen: dict = {}
    forward = model.token2wav.forward

    def record(code, **kwargs):
        seen["codes"] = code[0].tolist()
        return forward(code, **kwargs)

    model.token2wav.forward = record
    pixels = inputs.pop("pixel_values")
    torch.manual_seed(SEED)
    sequences, wave = model.generate(
        **inputs, thinker_pixel_values=pixels, generation_mode="audio", speaker="Chelsie",
        thinker_do_sample=False, talker_do_sample=False, thinker_max_new_tokens=THINKER_TOKENS,
        talker_max_new_tokens=TALKER_TOKENS, thinker_eos_token_id=[tokenizer.eos_token_id],
        talker_eos_token_id=[tokens.codec_pad, tokens.codec_end])
    model.token2wav.forward = forward
    assert result.text_tokens == sequences.shape[1] - inputs["input_ids"].shape[1]
    reply = tokenizer.decode(sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert result.text == reply
    assert result.audio_tokens == len(seen["codes"]) and len(seen["codes"]) > 3
    np.testing.assert_allclose(result.audio, wave.numpy(), atol=WAVE_ATOL, rtol=0)
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0
