"""The parity map of Qwen2.5-Omni speech: thinker tokens, talker codes and the waveform against transformers'
Qwen2_5OmniForConditionalGeneration.generate (greedy thinker and talker, the first voice of the speaker table)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
from vidloom.core.speech import SpeechRequest
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.parity.family import ParityMaps, SequenceParity

CODES_PER_TOKEN = 4
"""Talker codes allowed per reply token (the request's max_audio_tokens = this x its max tokens)."""
GREEDY = SamplingParams(temperature=0.0)


def _omni_request(prompt: str, seed: int, max_tokens: int) -> SpeechRequest:
    # The documented system turn, given on both sides (ours would add it to a chat without one; the reference not).
    chat = ChatRequest((ChatMessage("system", (ChatPart("text", SPOKEN_SYSTEM_PROMPT),)),
                        ChatMessage("user", (ChatPart("text", prompt),))),
                       SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return SpeechRequest(chat=chat, talker_sampling=GREEDY, seed=seed, max_audio_tokens=CODES_PER_TOKEN * max_tokens)


def _describe(request: SpeechRequest) -> str:
    assert request.chat is not None
    return (f"request: seed {request.seed}, up to {request.chat.sampling.max_tokens} reply tokens and "
            f"{request.max_audio_tokens} talker codes, greedy")


def _check(request: Any) -> SpeechRequest:
    """What the reference's generate() takes: a chat of text turns, answered greedily, not streamed."""
    from vidloom.core.errors import InvalidRequest

    if not isinstance(request, SpeechRequest) or request.chat is None:
        raise InvalidRequest("request", "Qwen2.5-Omni parity compares an answered chat (SpeechRequest(chat=...))")
    if not (request.chat.sampling.greedy and request.talker_sampling.greedy):
        raise InvalidRequest("temperature", "parity compares greedy decoding (temperature 0) on both sides")
    if request.audio_chunk_codes is not None:
        raise InvalidRequest("audio_chunk_codes", "the reference decodes the waveform once; leave it unset")
    if any(part.type != "text" for message in request.chat.messages for part in message.content):
        raise InvalidRequest("messages", "the parity map sends text turns only")
    return request


def _run_ours(generator: Any, request: Any) -> Mapping[str, Any]:
    out = generator.engine.run(_check(request))
    return {"thinker": list(out["thinker"].reply_ids), "talker": out["codes"].tolist(),
            "vocoder.audio": np.asarray(out["audio"], dtype=np.float32)}


def _eos_ids(tokenizer: Any) -> list[int]:
    # Qwen2.5-Omni's generation config ends a reply at <|im_end|> or <|endoftext|>.
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


def _run_reference(model: Any, request: Any) -> Mapping[str, Any]:
    from transformers import AutoTokenizer

    request = _check(request)
    assert request.chat is not None
    tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
    messages = [{"role": m.role, "content": m.text} for m in request.chat.messages]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    talker = model.config.talker_config
    seen: dict[str, list[int]] = {"codes": []}
    forward = model.token2wav.forward

    def record_codes(code: torch.Tensor, **kwargs: Any) -> Any:  # generate() keeps the codes to itself
        seen["codes"] = code[0].tolist()
        return forward(code, **kwargs)

    model.token2wav.forward = record_codes
    try:
        # token2wav draws its initial noise from the global RNG; ours from the request's seed, the same draw.
        torch.manual_seed(int(request.seed or 0))
        with torch.inference_mode():
            sequences, wave = model.generate(
                prompt["input_ids"], attention_mask=prompt["attention_mask"], generation_mode="audio",
                speaker=request.voice or next(iter(model.speaker_map)), thinker_do_sample=False,
                talker_do_sample=False, thinker_max_new_tokens=request.chat.sampling.max_tokens,
                talker_max_new_tokens=request.max_audio_tokens, thinker_eos_token_id=_eos_ids(tokenizer),
                talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id])
    finally:
        del model.token2wav.forward  # the class's forward again
    return {"thinker": sequences[0, prompt["input_ids"].shape[1]:].tolist(), "talker": seen["codes"],
            "vocoder.audio": wave.reshape(-1).float().numpy()}


QWEN_OMNI = SequenceParity(
    architecture="Qwen2_5OmniForConditionalGeneration",
    build_request=_omni_request,
    run_ours=_run_ours,
    run_reference=_run_reference,
    sequences=("thinker", "talker"),
    output="vocoder.audio",
    describe=_describe,
)

PARITY = ParityMaps(sequences=(QWEN_OMNI,))
