"""Qwen3-Omni's speech codes (our talker inputs, talker decode loop and code predictor) against transformers'
`generate(..., return_audio=True)` on two tiny random checkpoints, greedy on both sides (generate() mirrors the
talker's do_sample onto the code predictor): the thinker's reply ids and every codebook of every codec frame are
identical. The thinker's states at accept_hidden_layer come out of our decoder through the paged KV pool; the
reference's codes are read where generate() hands them to code2wav. The waveform: code2wav (transformers' module,
loaded from the checkpoint by our loader) over our frames in generate()'s chunks equals generate()'s audio
within WAVE, and streamed in STREAM_CHUNK-frame chunks (the talker's streaming) within STREAMED of it."""

from __future__ import annotations

import pytest
import torch

from vidloom.loading.diffusers_dir import read_json

from tests.helpers.qwen3_omni_checkpoints import TALKERS, THINKERS, load_reference, write_tiny_thinker
from vidloom.families.qwen3_omni.code2wav import CHUNK_FRAMES, LEFT_CONTEXT, WaveChunks, decode_chunk, load_code2wav
from vidloom.families.qwen3_omni.load import WEIGHTS_STEM, load_talker, load_thinker, read_config
from vidloom.families.qwen3_omni.speech_codes import generate_frames, greedy, talker_inputs
from vidloom.layers.rotary import text_positions
from vidloom.runtime.paged_kv import KVLayout, PagedKVPool

PROMPT = "tell me about kites"
CONCURRENT = ("tell me about kites", "why is the sea blue", "hello there")
REPLY_TOKENS = 8
TALKER_TOKENS = 40  # generate()'s talker_max_new_tokens: at most 39 frames
WAVE = 1e-6  # the same module on the same frames (measured: 0.0 on samples up to 0.2)
# Chunks of 4 frames with 48 frames of left context (over the tiny code2wav's causal reach, ~45 frames: its
# upsampling is 8x where the released one's is 1920x, so its dilated convs reach further back in frames); measured
# 7.3e-8 on samples up to 0.2 (summation order).
STREAMED = 1e-6
STREAM_CHUNK, STREAM_CONTEXT = 4, 48


def _thinker_reply(thinker, prompt: list[int], eos: int) -> tuple[list[int], torch.Tensor]:
    """Greedy reply through the paged pool -> (prompt + reply ids, tapped states of every id read [P + R - 1])."""
    c = thinker.config
    pool = PagedKVPool(KVLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, num_blocks=4),
                       torch.device("cpu"), torch.float32)
    pool.allocator.reserve("chat", len(prompt) + REPLY_TOKENS)
    ids, fed, start, states = list(prompt), list(prompt), 0, []
    for _ in range(REPLY_TOKENS):
        kv = pool.batch([("chat", start, len(fed))], thinker.attention_scale)
        logits, tapped = thinker(torch.tensor(fed), text_positions(start, len(fed)), kv=kv,
                                 logits_at=torch.tensor([len(fed) - 1]), return_hidden=True)
        states.append(tapped)
        start += len(fed)
        ids.append(int(logits[0].argmax()))
        if ids[-1] == eos:
            break
        fed = ids[-1:]
    return ids, torch.cat(states)


@pytest.mark.parametrize("pair", list(zip(THINKERS, TALKERS)), ids=lambda p: p[1].name)
def test_greedy_talker_codes_equal_generate(tmp_path, pair):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folder = write_tiny_thinker(tmp_path, pair[0], talker=pair[1])
        config = read_config(folder)
        thinker = load_thinker(folder, config, torch.device("cpu"), torch.float32)
        talker = load_talker(folder, config, torch.device("cpu"), torch.float32)
        reference = load_reference(folder)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        with torch.inference_mode():
            sequences, wave, theirs = _generate(reference, prompt, [tokenizer.eos_token_id])
            p = prompt["input_ids"].shape[1]
            ids, tapped = _thinker_reply(thinker, prompt["input_ids"][0].tolist(), tokenizer.eos_token_id)
            inputs = talker_inputs(talker, thinker.embed, ids, p, tapped, config.speech.speakers["chelsie"],
                                   [tokenizer.eos_token_id])
            ours = generate_frames(talker, inputs, lambda logits: int(greedy(logits)), lambda logits, g: greedy(logits),
                                   TALKER_TOKENS - 1)
            code2wav = load_code2wav(folder, read_json(folder / "config.json"), torch.device("cpu"), torch.float32,
                                     WEIGHTS_STEM)
            whole = _speak(code2wav, ours, CHUNK_FRAMES, LEFT_CONTEXT)
            streamed = _speak(code2wav, ours, STREAM_CHUNK, STREAM_CONTEXT)
    finally:
        torch.set_num_threads(threads)
    assert ids == sequences[0].tolist()
    assert len(ours) >= 4 and theirs.shape[1] == config.speech.code_groups
    assert torch.equal(ours, theirs), (ours.shape, theirs.shape)
    reference_wave = wave[0, 0].numpy()
    assert whole.shape == reference_wave.shape
    assert abs(whole - reference_wave).max() <= WAVE
    assert abs(streamed - whole).max() <= STREAMED


def _generate(reference, prompt, eos: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' greedy generate(return_audio=True): (sequences, waveform, codes [frames, groups] as it hands
    them to code2wav)."""
    seen = []
    decode = reference.code2wav.chunked_decode
    reference.code2wav.chunked_decode = lambda codes, **kw: seen.append(codes) or decode(codes, **kw)
    try:
        sequences, wave = reference.generate(
            prompt["input_ids"], attention_mask=prompt["attention_mask"], return_audio=True, speaker="chelsie",
            thinker_do_sample=False, talker_do_sample=False, thinker_max_new_tokens=REPLY_TOKENS,
            talker_max_new_tokens=TALKER_TOKENS, thinker_eos_token_id=eos)
    finally:
        reference.code2wav.chunked_decode = decode
    return sequences, wave, seen[0][0].T


def test_concurrent_speech_runs_one_predictor_forward_per_step_and_each_equals_alone_and_generate(tmp_path):
    """Three chats answered aloud at once (greedy): the code predictor runs once per talker step for all of them
    (3 rows), and each request's codes equal its run alone and transformers' generate for its prompt."""
    from transformers import AutoTokenizer

    from tests.helpers.speech_runs import speak_together
    from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
    from vidloom.core.speech import SpeechRequest
    from vidloom.families.qwen3_omni.program import eos_ids
    from vidloom.generator import VideoGenerator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folder = write_tiny_thinker(tmp_path, THINKERS[0], talker=TALKERS[0])
        gen = VideoGenerator.from_pretrained(str(folder), device="cpu")
        tokenizer = AutoTokenizer.from_pretrained(folder)

        def request(text: str) -> SpeechRequest:
            chat = ChatRequest((ChatMessage("user", (ChatPart("text", text),)),),
                               SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS))
            return SpeechRequest(chat=chat, voice="chelsie", talker_sampling=SamplingParams(temperature=0.0),
                                 max_audio_tokens=TALKER_TOKENS - 1)

        solo = [gen.engine.submit(request(text)).finish()["frames"] for text in CONCURRENT]
        rows: list[int] = []
        hook = gen.engine.instance["talker"].predictor.register_forward_pre_hook(
            lambda module, args: rows.append(int(args[0].shape[0])))
        try:
            outs, _ = speak_together(gen, [request(text) for text in CONCURRENT], "interleave",
                                     talker=gen.engine.instance["talker"].decoder)
        finally:
            hook.remove()
        reference = load_reference(folder)
        theirs = []
        with torch.inference_mode():
            for text in CONCURRENT:
                prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                       add_generation_prompt=True, return_tensors="pt",
                                                       return_dict=True)
                theirs.append(_generate(reference, prompt, list(eos_ids(tokenizer)))[2])
    finally:
        torch.set_num_threads(threads)
    assert max(rows) == len(CONCURRENT)
    for out, alone, ref in zip(outs, solo, theirs):
        assert len(alone) >= 4 and out["frames"].tolist() == alone.tolist() == ref.tolist()


def _speak(code2wav, frames: torch.Tensor, chunk: int, context: int):
    chunks = WaveChunks(chunk, context)
    while chunks.ready(len(frames), finished=True):
        stop = chunks.stop(len(frames))
        chunks.add(decode_chunk(code2wav, frames, chunks.emitted, stop, chunks.left_context, chunks.spoken), stop)
    return chunks.audio()
