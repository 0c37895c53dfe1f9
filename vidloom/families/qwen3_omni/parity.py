"""The parity map of Qwen3-Omni chat: the thinker's greedy reply ids, and its next-token logits after the prompt,
against transformers' Qwen3OmniMoeForConditionalGeneration (generate without audio; the thinker's forward)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, ChatResult, SamplingParams
from vidloom.core.errors import InvalidRequest
from vidloom.layers.rotary import text_positions
from vidloom.parity.family import ParityMaps, SequenceParity

FIRST_LOGITS = "thinker.first_logits"
"""The compared signal: the thinker's logits [vocab] at the prompt's last token (float32)."""


def _chat_request(prompt: str, seed: int, max_tokens: int) -> ChatRequest:
    return ChatRequest((ChatMessage("user", (ChatPart("text", prompt),)),),
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed))


def _check(request: Any) -> ChatRequest:
    """What the reference's generate() takes here: text turns, answered greedily."""
    if not isinstance(request, ChatRequest):
        raise InvalidRequest("request", "Qwen3-Omni parity compares a chat (ChatRequest)")
    if not request.sampling.greedy:
        raise InvalidRequest("temperature", "parity compares greedy decoding (temperature 0) on both sides")
    if any(part.type != "text" for message in request.messages for part in message.content):
        raise InvalidRequest("messages", "the parity map sends text turns only")
    return request


def _run_ours(generator: Any, request: Any) -> Mapping[str, Any]:
    from vidloom.runtime.chat_stream import stream_alone

    request = _check(request)
    result = list(stream_alone(generator.engine, request))[-1]
    assert isinstance(result, ChatResult)
    prompt = generator.engine.decoder.chat_slots(request)["chat"].prompt_ids
    thinker = generator.engine.instance["thinker"]
    ids = torch.tensor(prompt, device=next(thinker.parameters()).device)
    with torch.inference_mode():
        logits = thinker(ids, text_positions(0, len(prompt), ids.device), logits_at=torch.tensor([len(prompt) - 1]))
    return {"thinker": list(result.token_ids), FIRST_LOGITS: logits[0].float().cpu().numpy()}


def _eos_ids(tokenizer: Any) -> list[int]:
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    return sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


def _run_reference(model: Any, request: Any) -> Mapping[str, Any]:
    from transformers import AutoTokenizer

    request = _check(request)
    tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
    turns = [{"role": m.role, "content": m.text} for m in request.messages]
    prompt = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        sequences = model.generate(prompt["input_ids"], attention_mask=prompt["attention_mask"], return_audio=False,
                                   thinker_do_sample=False, thinker_max_new_tokens=request.sampling.max_tokens,
                                   thinker_eos_token_id=_eos_ids(tokenizer))
        logits = model.thinker(input_ids=prompt["input_ids"]).logits[0, -1]
    return {"thinker": sequences[0, prompt["input_ids"].shape[1]:].tolist(),
            FIRST_LOGITS: np.asarray(logits.float().numpy())}


QWEN3_OMNI = SequenceParity(
    architecture="Qwen3OmniMoeForConditionalGeneration",
    build_request=_chat_request,
    run_ours=_run_ours,
    run_reference=_run_reference,
    sequences=("thinker",),
    output=FIRST_LOGITS,
    describe=lambda request: f"request: up to {request.sampling.max_tokens} reply tokens, greedy",
)

PARITY = ParityMaps(sequences=(QWEN3_OMNI,))
