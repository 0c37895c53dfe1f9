"""Qwen3-Omni audio and image inputs: our thinker (towers, multimodal positions, deepstack) vs transformers,
float32 CPU, on both tiny thinker configurations.

The reference is driven as its processor would drive it: Whisper features padded to chunk_length, Qwen2-VL
patches, each placeholder widened to its tower's token count. Greedy ids must equal `thinker.generate`'s and the
logits after the prompt the thinker forward's within 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import THINKERS, load_reference, write_tiny_thinker
from tests.parity.test_qwen_omni_inputs import clip, png_url
from vidloom.core.chat import messages_from_openai
from vidloom.families.qwen3_omni.encoders import audio_output_length
from vidloom.families.qwen3_omni.program import eos_ids, media_prompter
from vidloom.generator import VideoGenerator
from vidloom.models.omni_media import encode_media
from vidloom.media.audio_upload import load_input_audio
from vidloom.media.chat_video import load_chat_video
from vidloom.media.image import load_image
from vidloom.models.omni_towers import load_processors

MAX_TOKENS, LOGITS_ATOL = 12, 1e-4
QUESTION = "what is a kite?"


@pytest.fixture(scope="module", params=THINKERS, ids=lambda spec: spec.name)
def tiny(request, tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp(request.param.name), request.param)
    return folder, load_reference(folder), VideoGenerator.from_pretrained(str(folder))


def conversation(kinds: tuple[str, ...], seed: int):
    """One user turn with an audio clip and/or an image, then a question: (our messages, the media by kind)."""
    parts, media = [], {}
    for kind in kinds:
        if kind == "audio":
            part, media[kind] = clip(seed, 2.3)  # over one 100-frame chunk of the audio tower: two chunks
        else:
            url, media[kind] = png_url(seed, (90, 70))
            part = {"type": "image_url", "image_url": {"url": url}}
        parts.append(part)
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}], media


def reference_inputs(folder, tokenizer, media: dict) -> dict:
    """The processor's way: the template renders one placeholder per part, then each is widened."""
    extractor, image_processor = load_processors(folder)
    parts = [{"type": kind} for kind in media] + [{"type": "text", "text": QUESTION}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                         add_generation_prompt=True)
    inputs = {}
    if "audio" in media:
        feats = extractor(media["audio"], sampling_rate=16000, padding="max_length", return_attention_mask=True,
                          return_tensors="pt")
        tokens = audio_output_length(int(feats["attention_mask"].sum()))
        inputs.update(input_features=feats["input_features"], feature_attention_mask=feats["attention_mask"])
        text = text.replace("<|audio_pad|>", "<|audio_pad|>" * tokens)
    if "image" in media:
        pix = image_processor(images=[media["image"]], return_tensors="pt")
        inputs.update(pixel_values=pix["pixel_values"], image_grid_thw=pix["image_grid_thw"])
        text = text.replace("<|image_pad|>", "<|image_pad|>" * (int(pix["image_grid_thw"].prod()) // 4))
    ids = tokenizer(text, return_tensors="pt")
    return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"], **inputs}


def our_first_logits(gen, messages) -> torch.Tensor:
    instance = gen.engine.instance
    prompter, thinker = media_prompter(instance), instance["thinker"]
    ids, media = prompter.prompt(messages_from_openai(messages, load_image, load_input_audio, load_chat_video))
    rows = encode_media(prompter.encoders, media.pieces, torch.float32)
    with torch.inference_mode():
        return thinker(torch.tensor(ids), media.positions, logits_at=torch.tensor([len(ids) - 1]),
                       embeds_at=(media.at, rows))[0]


def assert_matches_the_thinker(gen, model, messages, inputs: dict, max_tokens: int) -> torch.Tensor:
    """Our greedy chat equals `thinker.generate` on the reference's `inputs`, and our logits after the prompt its
    forward's within LOGITS_ATOL; returns ours."""
    tokenizer = gen.engine.instance["tokenizer"]
    result = gen.chat(messages, max_tokens=max_tokens, temperature=0.0)
    with torch.inference_mode():
        out = model.thinker.generate(**inputs, max_new_tokens=max_tokens, do_sample=False,
                                     eos_token_id=list(eos_ids(tokenizer)))
        logits = model.thinker(**inputs).logits[0, -1]
    expected = out[0, inputs["input_ids"].shape[1]:].tolist()
    assert list(result.token_ids) == expected and len(expected) == max_tokens
    assert result.prompt_tokens == inputs["input_ids"].shape[1]
    ours = our_first_logits(gen, messages)
    np.testing.assert_allclose(ours.numpy(), logits.numpy(), atol=LOGITS_ATOL, rtol=0)
    return ours


@pytest.mark.parametrize("kinds", [("audio",), ("image",), ("audio", "image")], ids="+".join)
def test_greedy_ids_and_logits_match_the_thinker(tiny, kinds):
    folder, model, gen = tiny
    tokenizer = gen.engine.instance["tokenizer"]
    messages, media = conversation(kinds, 1)
    ours = assert_matches_the_thinker(gen, model, messages, reference_inputs(folder, tokenizer, media), MAX_TOKENS)
    # the towers matter: another clip or image moves the logits far past the tolerance
    other, _ = conversation(kinds, 2)
    assert (our_first_logits(gen, other) - ours).abs().max() > 1000 * LOGITS_ATOL
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0
