"""Speech: time to first audio and real-time factor (audio seconds per wall second) with 1 and 8 concurrent
requests through the AsyncEngine (thinker steps batched with every running sequence on the paged KV pool,
talker steps batched on the talker's pool, code2wav / token2wav steps scheduled per request) vs transformers'
generate on the same random weights (one request after another: its generate has no concurrent requests):
Qwen2.5-Omni's `generate(generation_mode="audio")`, or with `--family qwen3-omni` Qwen3-Omni's
`generate(return_audio=True)` (its talker's code predictor batched across our sequences too).

    OMP_NUM_THREADS=1 python bench/speech.py [--family qwen2.5-omni|qwen3-omni] [--size tiny|mid]
                                             [--thinker-tokens 16] [--audio-tokens 100] [--to-cap]
                                             [--rounds 2] [--policy interleave]

Greedy thinker and talker everywhere, the same caps on both sides. vidloom runs twice: "whole" (the audio
decoder once on every code, transformers' path: time to first audio is the completion time) and
"streamed" (audio_chunk_codes=25, the server's first chunk for every streamed format, growing after: time to
first audio is when the first AudioChunkEvent leaves the run, while the talker still decodes). The three
settings alternate within each round (whole, streamed, transformers at 1 request, then at 8), each
measurement recording the load average; the JSON keeps every run and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.qwen3_omni_checkpoints import TALKER_A, THINKER_A, write_tiny_thinker  # noqa: E402
from tests.helpers.qwen_omni_checkpoints import OMNI_A, TinyOmni, write_tiny_omni  # noqa: E402
from tests.helpers.speech_runs import speak_whole_budget  # noqa: E402
from vidloom.serving.speech_stream import STREAM_CHUNK_CODES  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 8, 8]}
SIZES = {
    "tiny": OMNI_A,
    # Mid-size: a 256-wide 4-layer thinker, 192-wide talker, 128-wide DiT, and the released vocoder's rates
    # (240 samples per mel frame at 24 kHz) at 64 channels.
    "mid": TinyOmni(
        name="omni-mid",
        thinker=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, rope_parameters=ROPE),
        talker=dict(hidden_size=192, intermediate_size=576, num_hidden_layers=4, num_attention_heads=3,
                    num_key_value_heads=1, head_dim=64, rope_parameters=ROPE),
        dit=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, head_dim=32, ff_mult=2, emb_dim=64,
                 block_size=24, look_ahead_layers=[2], look_backward_layers=[0, 3], repeats=2, mel_dim=80,
                 enc_emb_dim=64, enc_dim=64, enc_channels=[64, 64, 64, 64, 192], enc_kernel_sizes=[5, 3, 3, 3, 1],
                 enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=32, enc_res2net_scale=2, enc_se_channels=32),
        bigvgan=dict(mel_dim=80, upsample_initial_channel=64, resblock_kernel_sizes=[3, 7],
                     resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], upsample_rates=[5, 3, 2, 2, 2, 2],
                     upsample_kernel_sizes=[11, 7, 4, 4, 4, 4]),
    ),
}
CONCURRENCY = (1, 8)
QUESTIONS = ["what is a kite?", "tell me about kites in one sentence please", "hello world"]


QWEN3_SIZES = {"tiny": (THINKER_A, TALKER_A)}  # the parity tests' first pair


def _checkpoint(size: str) -> Path:
    spec = SIZES[size]
    return cached(spec.name, lambda folder: write_tiny_omni(folder, spec), marker="spk_dict.pt")


def _qwen3_checkpoint(size: str) -> Path:
    thinker, talker = QWEN3_SIZES[size]
    return cached(f"qwen3-omni-{thinker.name}-{talker.name}",
                  lambda folder: write_tiny_thinker(folder, thinker, talker=talker), marker="config.json")


class VidloomSpeech:
    """One AsyncEngine over the checkpoint; `run(n, chunk)` speaks n replies at once (chunk None: whole)."""

    def __init__(self, folder: Path, thinker_tokens: int, audio_tokens: int, to_cap: bool,
                 policy: str = "interleave") -> None:
        from vidloom.generator import VideoGenerator
        from vidloom.runtime.async_engine import AsyncEngine

        # fifo would run concurrent speech requests one after another; interleave gives each a turn per round
        # and (since the talker moved onto the paged pool) steps every talker in one forward.
        self.engine = AsyncEngine(VideoGenerator.from_pretrained(folder, device="cpu").engine, slots=8,
                                  policy=policy)
        self.thinker_tokens, self.audio_tokens = thinker_tokens, audio_tokens
        if to_cap:  # a random talker stops anywhere: make every utterance `audio_tokens` codes long
            [talker] = [node.loop for node in self.engine.engine.program.nodes if node.name == "talker"]
            speak_whole_budget(talker)

    async def _one(self, i: int, started: float, chunk: int | None):
        from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
        from vidloom.core.output import AudioChunkEvent
        from vidloom.core.speech import SpeechRequest

        chat = ChatRequest((ChatMessage("user", (ChatPart("text", QUESTIONS[i % len(QUESTIONS)]),)),),
                           SamplingParams(temperature=0.0, max_tokens=self.thinker_tokens))
        request = SpeechRequest(chat=chat, talker_sampling=SamplingParams(temperature=0.0), seed=i,
                                max_audio_tokens=self.audio_tokens, audio_chunk_codes=chunk)
        first: list[float] = []

        def on_event(event) -> None:
            if isinstance(event, AudioChunkEvent) and not first:
                first.append(time.perf_counter())

        result = await self.engine.submit(request, on_event).result()
        done = time.perf_counter()
        return result, (first[0] if first else done) - started

    def run(self, n: int, chunk: int | None) -> dict[str, float]:
        async def many():
            started = time.perf_counter()
            return await asyncio.gather(*(self._one(i, started, chunk) for i in range(n)))

        started = time.perf_counter()
        results = asyncio.run(many())
        wall = time.perf_counter() - started
        audio_s = sum(r.duration_s for r, _ in results)
        return {"audio_s": audio_s, "wall_s": wall, "rtf": audio_s / wall,
                "first_audio_mean_s": statistics.mean(t for _, t in results),
                "first_audio_min_s": min(t for _, t in results)}

    def close(self) -> None:
        self.engine.close()


class TransformersSpeech:
    """transformers' generate(generation_mode="audio") on the same weights, one request after another."""

    def __init__(self, folder: Path, thinker_tokens: int, audio_tokens: int, to_cap: bool) -> None:
        from transformers import AutoTokenizer

        from tests.helpers.qwen_omni_checkpoints import load_reference

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = load_reference(folder)
        talker = self.model.config.talker_config
        # --to-cap: an end id the talker never samples (its vocabulary is smaller), so it speaks to its cap
        self.ends = [talker.vocab_size + 1] if to_cap else [talker.tts_codec_pad_token_id,
                                                             talker.tts_codec_end_token_id]
        self.thinker_tokens, self.audio_tokens = thinker_tokens, audio_tokens

    @torch.inference_mode()
    def _one(self, i: int) -> float:
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                                 add_generation_prompt=True, return_tensors="pt", return_dict=True)
        torch.manual_seed(i)
        try:
            _, wave = self.model.generate(ids["input_ids"], generation_mode="audio", speaker="Chelsie",
                                          thinker_do_sample=False, talker_do_sample=False,
                                          thinker_max_new_tokens=self.thinker_tokens,
                                          talker_max_new_tokens=self.audio_tokens,
                                          thinker_eos_token_id=[self.tokenizer.eos_token_id],
                                          talker_eos_token_id=self.ends)
        except RuntimeError:  # its token2wav fails on zero codes (a random talker that ends at once): no audio
            return 0.0
        return wave.numel() / 24000

    def run(self, n: int, chunk: None = None) -> dict[str, float]:
        started, firsts, audio_s = time.perf_counter(), [], 0.0
        for i in range(n):
            audio_s += self._one(i)
            firsts.append(time.perf_counter() - started)
        wall = time.perf_counter() - started
        return {"audio_s": audio_s, "wall_s": wall, "rtf": audio_s / wall,
                "first_audio_mean_s": statistics.mean(firsts), "first_audio_min_s": min(firsts)}

    def close(self) -> None:
        pass


class Qwen3TransformersSpeech:
    """transformers' Qwen3-Omni generate(return_audio=True) on the same weights, one request after another."""

    def __init__(self, folder: Path, thinker_tokens: int, audio_tokens: int, to_cap: bool) -> None:
        from transformers import AutoTokenizer

        from tests.helpers.qwen3_omni_checkpoints import load_reference

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = load_reference(folder)
        talker = self.model.config.talker_config
        self.speaker = next(iter(talker.speaker_id))
        # --to-cap: an end id the talker never samples (past its vocabulary), so it speaks to its cap
        self.ends = [talker.text_config.vocab_size + 1] if to_cap else [talker.codec_eos_token_id]
        self.thinker_tokens, self.audio_tokens = thinker_tokens, audio_tokens

    @torch.inference_mode()
    def _one(self, i: int) -> float:
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                                 add_generation_prompt=True, return_tensors="pt", return_dict=True)
        _, wave = self.model.generate(ids["input_ids"], attention_mask=ids["attention_mask"], return_audio=True,
                                      speaker=self.speaker, thinker_do_sample=False, talker_do_sample=False,
                                      thinker_max_new_tokens=self.thinker_tokens,
                                      talker_max_new_tokens=self.audio_tokens + 1,
                                      thinker_eos_token_id=[self.tokenizer.eos_token_id],
                                      talker_eos_token_id=self.ends)
        return 0.0 if wave is None else wave.numel() / 24000

    run = TransformersSpeech.run
    close = TransformersSpeech.close


# --family -> (its checkpoint by size, its sizes, transformers' side)
FAMILIES = {"qwen2.5-omni": (_checkpoint, SIZES, TransformersSpeech),
            "qwen3-omni": (_qwen3_checkpoint, QWEN3_SIZES, Qwen3TransformersSpeech)}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen2.5-omni", choices=sorted(FAMILIES))
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--audio-tokens", type=int, default=100)
    parser.add_argument("--to-cap", action="store_true", help="every utterance is --audio-tokens codes long")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the three settings")
    parser.add_argument("--policy", default="interleave", help="the AsyncEngine's scheduling policy")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint, sizes_of, reference = FAMILIES[args.family]
    if args.size not in sizes_of:
        parser.error(f"--family {args.family} has sizes {', '.join(sorted(sizes_of))}")
    folder = checkpoint(args.size)
    sizes = (args.thinker_tokens, args.audio_tokens, args.to_cap)
    ours, theirs = VidloomSpeech(folder, *sizes, policy=args.policy), reference(folder, *sizes)
    settings = {"vidloom": (ours, None), "vidloom_streamed": (ours, STREAM_CHUNK_CODES),
                "transformers_generate": (theirs, None)}
    runs: dict[str, dict[int, list]] = {name: {n: [] for n in CONCURRENCY} for name in settings}
    try:
        for side, chunk in settings.values():
            side.run(1, chunk)  # warm-up
        for _ in range(args.rounds):
            for n in CONCURRENCY:
                for name, (side, chunk) in settings.items():
                    load = os.getloadavg()[0]
                    runs[name][n].append({**side.run(n, chunk), "loadavg_1m": load})
    finally:
        ours.close()
    medians = {name: {n: _median(r) for n, r in by_n.items()} for name, by_n in runs.items()}
    whole, streamed, theirs_ = (medians[k] for k in settings)
    rows = [[str(n), f"{whole[n]['rtf']:.2f}", f"{streamed[n]['rtf']:.2f}", f"{theirs_[n]['rtf']:.2f}",
             f"{whole[n]['first_audio_mean_s']:.2f}", f"{streamed[n]['first_audio_mean_s']:.2f}",
             f"{theirs_[n]['first_audio_mean_s']:.2f}", f"{streamed[n]['first_audio_min_s']:.2f}"]
            for n in CONCURRENCY]
    print_table(["concurrent", "RTF whole", "RTF streamed", "RTF transformers", "first audio mean s (whole)",
                 "(streamed)", "(transformers)", "first audio min (streamed)"], rows)
    ratios = {n: {"streamed_vs_whole_wall": streamed[n]["wall_s"] / whole[n]["wall_s"],
                  "streamed_vs_whole_first_audio_mean": streamed[n]["first_audio_mean_s"] / whole[n]["first_audio_mean_s"],
                  "whole_vs_transformers_rtf": whole[n]["rtf"] / theirs_[n]["rtf"],
                  "streamed_vs_transformers_first_audio_mean":
                      streamed[n]["first_audio_mean_s"] / theirs_[n]["first_audio_mean_s"]} for n in CONCURRENCY}
    family = "" if args.family == "qwen2.5-omni" else f"-{args.family}"
    write_json(args.out or f"speech{family}-{args.size}{'-to-cap' if args.to_cap else ''}-cpu.json", {
        "environment": environment(), "family": args.family, "size": args.size, "thinker_tokens": args.thinker_tokens,
        "audio_tokens": args.audio_tokens, "to_cap": args.to_cap, "stream_chunk_codes": STREAM_CHUNK_CODES,
        "rounds": args.rounds, "interleaved": True, "policy": args.policy, **medians, "ratios": ratios, "runs": runs,
    })


if __name__ == "__main__":
    main()
