"""`vidloom chat --model DIR`: a terminal conversation with a chat model, one user turn per line of stdin.

Replies stream to stdout as they decode. `/reset` starts a new conversation, `/exit` (or end of input)
quits. Works with piped stdin, so a script can hold a conversation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from vidloom.cli.interrupt import say
from vidloom.core.chat import ChatResult, TokenDelta
from vidloom.core.errors import counted


def add_chat_parser(sub: argparse._SubParsersAction, dtypes: tuple[str, ...]) -> None:
    chat = sub.add_parser("chat", help="chat with a model that has an ar_decode loop (Cosmos3 Omni)")
    chat.add_argument("--model", required=True, help="checkpoint dir (a Cosmos3OmniPipeline folder) or registered id")
    chat.add_argument("--system", default=None, metavar="TEXT", help="system message opening the conversation")
    chat.add_argument("--max-tokens", type=int, default=None, metavar="N", help="completion tokens per reply")
    chat.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default: 0.7)")
    chat.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default: 1)")
    chat.add_argument("--top-k", type=int, default=0, help="sample among the K likeliest tokens (0: off)")
    chat.add_argument("--seed", type=int, default=None, help="seed for reproducible replies")
    chat.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")
    chat.add_argument("--voice", default=None, help="also speak each answer in this voice (a model with a talker), "
                                                    "written to --audio-dir")
    chat.add_argument("--audio-dir", default="chat-audio", metavar="DIR",
                      help="where --voice writes each answer's speech, reply-001.wav, ... (default: chat-audio)")
    chat.add_argument("--kv-pool-tokens", type=int, default=None, metavar="N",
                      help="tokens of paged KV cache (default 16384)")
    chat.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    chat.add_argument("--dtype", default=None, choices=dtypes, help="float32 | bfloat16 | float16")
    chat.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs")


def chat_command(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    from vidloom.cli.generate import check_device, quiet_third_party
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    quiet_third_party(args.verbose)
    check_device(args.device)
    sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                    seed=args.seed, stop=args.stop)
    deploy = DeployConfig(kv_pool_tokens=args.kv_pool_tokens)
    generator = VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype, deploy=deploy)
    if generator.engine.decoder is None:
        from vidloom.runtime.paged_decode import no_chat

        raise no_chat(generator.card.model_id)
    for note in generator.notes:  # a demo says its replies are noise, as `generate` does
        say(f"note: {note}")
    if args.voice is not None and generator.card.speech is None:
        from vidloom.runtime.speech_run import no_speech

        raise no_speech(generator.card.model_id)
    interactive = stdin.isatty()
    history = _opening(args.system)
    turn = 0
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            history = _opening(args.system)
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        if args.voice is not None:
            turn += 1
            reply = _spoken_reply(generator, history, sampling, args.voice, Path(args.audio_dir) / f"reply-{turn:03d}.wav",
                                  stdout)
            history.append({"role": "assistant", "content": reply.text})
            continue
        reply = _reply(generator, history, sampling, stdout)
        history.append({"role": "assistant", "content": reply.text})
        if not reply.text.strip():
            print(f"[{_why_empty(reply)}]", file=sys.stderr)
        if reply.finish_reason == "length":
            print(f"[reply cut at {counted(reply.completion_tokens, 'token')}: --max-tokens]", file=sys.stderr)


def _spoken_reply(generator: Any, history: list[dict[str, Any]], sampling: dict[str, Any], voice: str, path: Path,
                  stdout: TextIO) -> Any:
    """The answer, written by the thinker and spoken by the talker in one request; its speech saved as WAV."""
    from vidloom.media.speech_audio import encode_speech
    from vidloom.media.atomic import atomic_path

    result = generator.chat(history, audio={"voice": voice}, **sampling)
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(encode_speech(result.audio, result.sample_rate, "wav"))
    stdout.write(f"{result.text}\n")
    stdout.flush()
    print(f"[spoken: {path} ({result.duration_s:.2f} s, voice {result.voice})]", file=sys.stderr)
    return result


def _why_empty(reply: ChatResult) -> str:
    """Why the line above is blank: a bare newline alone reads as a hang or a bug."""
    if reply.completion_tokens == 0:
        return "empty reply: the model ended it at once (end-of-sequence token)"
    return (f"empty reply: its {counted(reply.completion_tokens, 'token')} decode to no visible text "
            "(special or whitespace tokens, or text cut by --stop)")


def _opening(system: str | None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}] if system else []


def _reply(generator: Any, history: list[dict[str, Any]], sampling: dict[str, Any], stdout: TextIO) -> ChatResult:
    result = None
    for item in generator.chat_stream(history, **sampling):
        if isinstance(item, TokenDelta) and item.text:
            stdout.write(item.text)
            stdout.flush()
        elif isinstance(item, ChatResult):
            result = item
    stdout.write("\n")
    stdout.flush()
    assert result is not None
    return result
