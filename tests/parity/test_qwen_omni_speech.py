"""Qwen2.5-Omni speech parity: our thinker -> talker -> token2wav program vs transformers, float32 CPU.

Greedy thinker ids and talker codes must be identical to `generate(generation_mode="audio")` (and to
the transformers components driven the same way for forced text); the waveform is compared within
WAVE_ATOL. token2wav draws its initial noise from the global RNG in transformers and from the
request's seed here: seeding the global RNG with the same number right before gives the same draw.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_CONFIGS, load_reference, write_tiny_omni
from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
from vidloom.core.speech import SpeechRequest
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.generator import VideoGenerator

# Same modules, same op order, float32: differences are summation-order noise through ~9 RK4 intervals of
# the DiT and the vocoder. 1e-4 of full scale (the waveform spans about [-0.2, 0.2] here) is far below
# what a wrong conditioning, step or filter produces (>= 1e-2).
WAVE_ATOL = 1e-4
GREEDY = SamplingParams(temperature=0.0)
THINKER_TOKENS, TALKER_TOKENS, SEED = 10, 24, 7
OWN_SYSTEM = "Qwen speaks with the voices of Chelsie and Ethan"  # a system turn after which both tiny talkers speak
QUESTION = "what is a kite?"  # a prompt after which both tiny talkers speak a while (random ones may stop at once)


@pytest.fixture(scope="module", params=OMNI_CONFIGS, ids=lambda spec: spec.name)
def omni(request, tmp_path_factory):
    torch.set_num_threads(1)  # the reference is 60x slower with two threads on a shared CPU
    folder = write_tiny_omni(tmp_path_factory.mktemp(request.param.name), request.param)
    return folder, load_reference(folder), VideoGenerator.from_pretrained(str(folder))


def run_speech(gen: VideoGenerator, request: SpeechRequest) -> dict:
    return gen.engine.submit(request).finish()


def capture_codes(model):
    """Wrap the reference's token2wav to record the codes generate() hands it."""
    seen: dict[str, list[int]] = {}
    forward = model.token2wav.forward

    def record(code, **kwargs):
        seen["codes"] = code[0].tolist()
        return forward(code, **kwargs)

    model.token2wav.forward = record
    return seen


@pytest.mark.parametrize("system", [None, OWN_SYSTEM], ids=["documented-system-prompt", "own-system-message"])
def test_generated_reply_matches_generate(omni, system):
    """A spoken chat without a system message answers under the model card's documented prompt (the reference is
    given it explicitly, as the model card tells its users to); one with its own system message keeps it."""
    folder, model, gen = omni
    tokenizer = gen.engine.instance["tokenizer"]
    tokens = gen.engine.instance["talker_tokens"]
    own = () if system is None else (ChatMessage("system", (ChatPart("text", system),)),)
    chat = ChatRequest((*own, ChatMessage("user", (ChatPart("text", QUESTION),))),
                       SamplingParams(temperature=0.0, max_tokens=THINKER_TOKENS))
    out = run_speech(gen, SpeechRequest(chat=chat, voice="Ethan", talker_sampling=GREEDY, seed=SEED,
                                        max_audio_tokens=TALKER_TOKENS))
    assert gen.card.spoken_system_prompt == SPOKEN_SYSTEM_PROMPT
    messages = [{"role": "system", "content": system or SPOKEN_SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    seen = capture_codes(model)
    torch.manual_seed(SEED)
    sequences, wave = model.generate(
        prompt["input_ids"], attention_mask=prompt["attention_mask"], generation_mode="audio", speaker="Ethan", thinker_do_sample=False,
        talker_do_sample=False, thinker_max_new_tokens=THINKER_TOKENS, talker_max_new_tokens=TALKER_TOKENS,
        thinker_eos_token_id=[tokenizer.eos_token_id], talker_eos_token_id=[tokens.codec_pad, tokens.codec_end])
    assert list(out["thinker"].reply_ids) == sequences[0, prompt["input_ids"].shape[1]:].tolist()
    assert out["codes"].tolist() == seen["codes"] and len(seen["codes"]) > 3
    np.testing.assert_allclose(out["audio"], wave.numpy(), atol=WAVE_ATOL, rtol=0)
    assert float(np.abs(out["audio"]).max()) > 0.02  # a waveform worth comparing
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


def reference_forced(model, prompt_ids: torch.Tensor, text_ids: torch.Tensor, voice: str, tokens, seed: int):
    """transformers' components driven as generate() drives them, with the reply forced to `text_ids`."""
    thinker, talker = model.thinker, model.talker
    ids = torch.cat([prompt_ids, text_ids])[None]
    with torch.no_grad():
        states = thinker(input_ids=ids, output_hidden_states=True).hidden_states
        rows = states[-1] + states[0]  # final normed state + input embedding, per token
        embed = thinker.get_input_embeddings()
        spk = model.speaker_map[voice]
        p = prompt_ids.shape[0]
        bos = embed(torch.tensor([[spk["bos_token"]]]))
        inputs_embeds = torch.cat([rows[:, :p], bos, rows[:, p:p + 1]], dim=1)
        reply = torch.cat([rows[:, p + 1:], embed(torch.tensor([[talker.text_eos_token]])),
                           embed(torch.tensor([[talker.text_pad_token]]))], dim=1)
        input_ids = torch.cat([torch.full((1, p), talker.codec_mask_token), torch.tensor([[talker.codec_pad_token,
                                                                                          talker.codec_bos_token]])], 1)
        text_ids_for_rope = torch.cat([prompt_ids[None], torch.tensor([[spk["bos_token"]]]), text_ids[None, :1]], 1)
        result = talker.generate(input_ids=input_ids, input_text_ids=text_ids_for_rope, thinker_reply_part=reply,
                                 inputs_embeds=inputs_embeds, suppress_tokens=[talker.codec_bos_token],
                                 max_new_tokens=TALKER_TOKENS, do_sample=False, repetition_penalty=1.05,
                                 eos_token_id=[tokens.codec_pad, tokens.codec_end], pad_token_id=tokens.codec_pad)
        codes = result[0, input_ids.shape[1]:].tolist()
        for i, code in enumerate(codes):
            if code in (tokens.codec_pad, tokens.codec_end):
                codes = codes[:i]
                break
        torch.manual_seed(seed)
        wave = model.token2wav(torch.tensor([codes]), conditioning=spk["cond"].float(),
                               reference_mel=spk["ref_mel"].float())
    return codes, wave.reshape(-1)


def test_forced_text_matches_components(omni):
    folder, model, gen = omni
    text = "the kite rose over the dunes"
    out = run_speech(gen, SpeechRequest(text=text, voice="Chelsie", talker_sampling=GREEDY, seed=SEED,
                                        max_audio_tokens=TALKER_TOKENS))
    speech = out["thinker"]
    tokenizer = gen.engine.instance["tokenizer"]
    assert list(speech.reply_ids) == tokenizer.encode(text, add_special_tokens=False) and speech.text == text
    codes, wave = reference_forced(model, speech.prompt_ids, speech.fed_ids, "Chelsie",
                                   gen.engine.instance["talker_tokens"], SEED)
    assert out["codes"].tolist() == codes and len(codes) > 3
    np.testing.assert_allclose(out["audio"], wave.numpy(), atol=WAVE_ATOL, rtol=0)


def test_voice_changes_the_mel(omni):
    """The speaker table reaches token2wav: the same codes in two voices give different mels (random vocoders
    barely move with their input, so the mel is where a voice that went missing shows)."""
    _, _, gen = omni
    outs = [run_speech(gen, SpeechRequest(text="hello world", voice=v, talker_sampling=GREEDY, seed=SEED,
                                          max_audio_tokens=8)) for v in ("Chelsie", "Ethan")]
    assert outs[0]["codes"].tolist() == outs[1]["codes"].tolist() and outs[0]["codes"].numel() > 0
    assert float((outs[0]["mel"] - outs[1]["mel"]).abs().max()) > 0.1
