"""`vidloom speak --model DIR --voice V --prompt TEXT -o out.wav`: say a text with a speech model's voice.

The format follows the output's suffix (.wav, .flac, .mp3, .opus, .aac, .pcm). Progress of the
thinker, talker and token2wav stages goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vidloom.cli.interrupt import say
from vidloom.core.errors import InvalidRequest


def add_speak_parser(sub: argparse._SubParsersAction, dtypes: tuple[str, ...]) -> None:
    from vidloom.cli.prompt_args import add_prompt_arguments

    speak = sub.add_parser("speak", help="say a text with a speech model (Qwen2.5-Omni)")
    add_prompt_arguments(speak, "what to say")
    speak.add_argument("--model", required=True, help="checkpoint dir (a Qwen2.5-Omni folder) or registered id")
    speak.add_argument("--voice", default=None, help="a voice of the checkpoint's speaker table (default: its first)")
    speak.add_argument("-o", "--output", default="speech.wav",
                       help="output file; .wav .flac .mp3 .opus .aac or .pcm (default: speech.wav)")
    speak.add_argument("--instructions", default=None, metavar="TEXT", help="how to say it (the turn it answers)")
    speak.add_argument("--seed", type=int, default=None, help="seed for reproducible speech")
    speak.add_argument("--greedy", action="store_true", help="pick the likeliest speech codes instead of sampling")
    speak.add_argument("--max-audio-tokens", type=int, default=None, metavar="N",
                       help="speech codes at most (50 per second of audio; default: from the text's length)")
    speak.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    speak.add_argument("--dtype", default=None, choices=dtypes, help="float32 | bfloat16 | float16")
    speak.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs")


def output_format(path: Path) -> str:
    from vidloom.media.speech_audio import SPEECH_FORMATS

    fmt = path.suffix.lower().lstrip(".")
    if fmt not in SPEECH_FORMATS:
        raise InvalidRequest("output", f"{path.name}: unknown audio format; use one of "
                                       f"{', '.join('.' + f for f in SPEECH_FORMATS)}")
    return fmt


def speak_command(args: argparse.Namespace) -> int:
    from vidloom.cli.generate import check_device, quiet_third_party
    from vidloom.core.output import ProgressEvent
    from vidloom.generator import VideoGenerator
    from vidloom.media.speech_audio import encode_speech
    from vidloom.media.atomic import atomic_path

    output = Path(args.output)
    fmt = output_format(output)  # before loading anything
    quiet_third_party(args.verbose)
    check_device(args.device)
    generator = VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    for note in generator.notes:
        say(f"note: {note}")

    def show(event: object) -> None:
        if isinstance(event, ProgressEvent) and event.total:
            print(f"\r{event.phase}: {event.step}/{event.total}", end="", file=sys.stderr, flush=True)

    result = generator.speak(args.prompt, args.voice, instructions=args.instructions, seed=args.seed,
                             max_audio_tokens=args.max_audio_tokens, greedy=args.greedy, on_event=show)
    print(file=sys.stderr)
    with atomic_path(output) as tmp:
        Path(tmp).write_bytes(encode_speech(result.audio, result.sample_rate, fmt))
    print(f"{output} ({result.duration_s:.2f} s, {result.sample_rate} Hz, voice {result.voice})")
    return 0
