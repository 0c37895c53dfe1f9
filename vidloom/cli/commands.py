"""The `vidloom` command: generate | chat | serve | models.

Every failure a user can cause ends as one `error: ...` line on stderr and exit status 2,
checked before the model loads wherever possible; Ctrl-C at any moment is one `cancelled` line and
exit status 130 (cli/interrupt.py), except that it is how a serving `vidloom serve` stops (status 0).
This module imports only light modules at its top, so `main` takes SIGINT before torch loads; the
commands import what they need when they run.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from vidloom import __version__
from vidloom.cli.interrupt import EXIT_INTERRUPTED, InterruptGuard, say
from vidloom.core.errors import InvalidRequest, VidloomError

if TYPE_CHECKING:
    from vidloom.core.deploy import DeployConfig
    from vidloom.runtime.parallel.worker import RankPlace

DTYPES = ("float32", "bfloat16", "float16")
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (its default prints the usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message}\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        """argparse's, with "did you mean" for each unknown flag, from the options of the command given."""
        from vidloom.cli.suggest import unrecognized

        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(extras, _options(self, parsed)))
        return parsed


def _options(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> set[str]:
    """The option strings of `parser` and of the subcommands `parsed` went through."""
    options = {opt for action in parser._actions for opt in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
            if chosen is not None:
                options |= _options(chosen, parsed)
    return options


def build_parser() -> argparse.ArgumentParser:
    from vidloom import registry
    from vidloom.cli.chat import add_chat_parser
    from vidloom.cli.speak import add_speak_parser
    from vidloom.cli.parity import add_parity_parser
    from vidloom.cli.actions import add_action_arguments
    from vidloom.cli.options import add_option_arguments
    from vidloom.cli.deploy_args import add_deploy_arguments
    from vidloom.cli.prompt_args import add_prompt_arguments
    from vidloom.cli.serve_args import add_serve_parser

    parser = _Parser(prog="vidloom", description="Video generation inference runtime")
    parser.add_argument("--version", action="version", version=f"vidloom {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate one video")
    gen.add_argument("--model", default=registry.DEFAULT_MODEL,
                     help=f"registered id, diffusers checkpoint dir or Hugging Face repo id "
                          f"(default: {registry.DEFAULT_MODEL}, random weights)")
    add_prompt_arguments(gen, "what to generate")
    gen.add_argument("--negative-prompt", default=None, help="card default (Wan: its long negative prompt)")
    gen.add_argument("-o", "--output", default=None,
                     help="file to write; the extension picks the format: .mp4 (H.264), .webm (VP9), .gif, "
                          ".png (one frame, or out_0000.png ... for several), .jpg / .webp (image models) "
                          "(default: out.mp4, or out.png for image models)")
    gen.add_argument("--audio-out", default=None, metavar="FILE.wav",
                     help="also write the sound alone as 16-bit PCM WAV, as long as the video (models that make "
                          "sound, e.g. LTX-2; their .mp4 output carries it as AAC too)")
    gen.add_argument("--image", action="append", default=None, metavar="PATH",
                     help="input image: the first frame on an image-to-video model, reference images on an image "
                          "model (repeat for several)")
    gen.add_argument("--video", default=None, metavar="PATH",
                     help="input video: video-to-video (Wan, with --strength) or a clip to continue (AnyFlow-FAR)")
    gen.add_argument("--steps", type=int, default=None, help="denoise steps (card default)")
    gen.add_argument("--seed", type=int, default=None, help="noise seed (random if unset; printed)")
    gen.add_argument("--height", type=int, default=None, help="pixels (card default; Wan: a multiple of 16)")
    gen.add_argument("--width", type=int, default=None, help="pixels (card default; Wan: a multiple of 16)")
    gen.add_argument("--frames", type=int, default=None, help="frame count; Wan needs 4k+1")
    gen.add_argument("--fps", type=int, default=None, help="frames per second of the output (card default)")
    gen.add_argument("--init-audio", default=None, metavar="PATH",
                     help="text-to-audio models: an audio file (at the model's sample rate) the clip starts from")
    gen.add_argument("--guidance", type=float, default=None, help="CFG scale; <= 1 turns CFG off")
    gen.add_argument("--shift", type=float, default=None, help="flow shift (card default)")
    gen.add_argument("--sampler", default=None, help="unipc | euler (card default)")
    gen.add_argument("--last-image", default=None, metavar="FILE", help="last frame too (first-last-frame cards)")
    gen.add_argument("--lora", action="append", default=None, metavar="PATH[:SCALE]",
                     help="a LoRA adapter file (diffusers/PEFT safetensors) applied at SCALE (default 1.0); repeat "
                          "to mix several (Wan, AnyFlow-FAR, Flux2, LTX-2)")
    gen.add_argument("--fuse-loras", action="store_true",
                     help="add the --lora adapters into the base weights at load instead of applying them per step "
                          "(faster steps, the same picture within rounding)")
    gen.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    gen.add_argument("--dtype", default=None, choices=DTYPES,
                     help="float32 | bfloat16 | float16 (default: card's on CUDA; on CPU bfloat16 where it "
                          "multiplies bf16 natively (AMX, AVX512-BF16), else float32; float32 for exact parity)")
    gen.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs, and each "
                     "config key the load accepted without effect, with its reason")
    gen.add_argument("--timings", action="store_true",
                     help="after the summary, print on stderr the seconds of each phase from process start "
                          "(start-up, checks, libraries, checkpoint, weights, warmup, generation, write)")
    add_option_arguments(gen)
    add_action_arguments(gen)
    add_deploy_arguments(gen)

    add_chat_parser(sub, DTYPES)
    add_speak_parser(sub, DTYPES)
    models = sub.add_parser("models", help="list registered model cards")
    models.add_argument("--capabilities", action="store_true",
                        help="print which deploy features each kind of checkpoint supports (from the cards)")
    add_serve_parser(sub, DTYPES)
    from vidloom.fleet.cli import add_fleet_parser

    add_fleet_parser(sub)
    add_parity_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line `argv` (default: sys.argv[1:]); returns the exit status.

    Called without argv it is the process's entry point: once the outcome is settled SIGINT stays
    ignored until the process exits. Called with argv (tests, embedding) it gives SIGINT back to the
    caller's handler on return.
    """
    guard = InterruptGuard.install()  # first: a Ctrl-C during the imports below must be ours too
    ended: list[int] = []  # the status of a command done with everything it opened (_end_process)
    if argv is None:
        atexit.register(_end_process, ended)  # registered first, runs last: after every library's handler
        atexit.register(guard.exit_if_interrupted)  # before torch's own exit handlers: runs after them
    try:
        return _run_command(argv, guard, ended)
    finally:
        if argv is not None:
            guard.restore()


def _run_command(argv: list[str] | None, guard: InterruptGuard, ended: list[int]) -> int:
    """Run the command; the line its failure prints comes after the outcome is settled, so a Ctrl-C
    cannot add a second one. A command that returns EXIT_INTERRUPTED has printed its own line.
    A command of ENDS_CLEAN that returned appends its status to `ended`."""
    line, args = None, None
    try:
        args = build_parser().parse_args(argv)
        with guard.held():  # every command imports torch; a Ctrl-C raised inside its start-up can abort the process
            import torch  # noqa: F401
        code = _dispatch(args, argv, guard)
    except KeyboardInterrupt:
        code, line = EXIT_INTERRUPTED, "cancelled"
    except Exception as exc:  # after a Ctrl-C, whatever an import or a load cut short raised is the interrupt
        if guard.interrupted:
            code, line = EXIT_INTERRUPTED, "cancelled"
        elif isinstance(exc, VidloomError):
            code, line = EXIT_USAGE, _error_line(exc)
        else:
            raise
    if guard.settle() and code != EXIT_INTERRUPTED:  # a Ctrl-C something swallowed: still interrupted
        code, line = EXIT_INTERRUPTED, "cancelled"
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    if args is not None and args.command in ENDS_CLEAN:
        ended.append(code)
    return code


ENDS_CLEAN = ("generate", "speak", "models")
"""Commands that have closed what they opened (files written and renamed, worker processes stopped) when they
return: their process may skip the interpreter's teardown (bench/startup.py: 2-4 s after a generate, freeing
torch's and transformers' modules one by one)."""


def _end_process(ended: list[int]) -> None:
    """The last atexit handler: a command of ENDS_CLEAN exits now with its status; the others (a server, a
    chat, a failure that raised) get the interpreter's full teardown."""
    if ended:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ended[0])


def _dispatch(args: argparse.Namespace, argv: list[str] | None, guard: InterruptGuard) -> int:
    if args.command == "models" and args.capabilities:
        from vidloom.cli.capabilities import print_capabilities

        return print_capabilities()
    if args.command == "models":
        return _models()
    if args.command == "fleet":
        from vidloom.fleet.cli import run_fleet

        return run_fleet(args)
    if args.command == "serve":
        return _serve(args, sys.argv[1:] if argv is None else argv, guard)
    if args.command == "chat":
        from vidloom.cli.chat import chat_command

        return chat_command(args)
    if args.command in ("generate", "speak"):
        from vidloom.cli.prompt_args import take_prompt

        take_prompt(args)
    if args.command == "speak":
        from vidloom.cli.speak import speak_command

        return speak_command(args)
    if args.command == "parity":
        from vidloom.cli.parity import parity_command

        return parity_command(args)
    from vidloom.cli.generate import generate_command

    return generate_command(args, _torchrun_place, _follow, guard)


def _error_line(exc: VidloomError) -> str:
    from vidloom.cli.generate import flag_of

    if isinstance(exc, InvalidRequest):
        return f"error: {flag_of(exc.field) or exc.field}: {_one_line(exc.message)}"
    return f"error: {_flagged(_one_line(str(exc)))}"


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _flagged(text: str) -> str:
    """"slots: must be >= 1" -> "--slots: must be >= 1": name the flag the user typed, when the
    message starts with a setting's field name and that field has a flag."""
    from vidloom.cli.generate import flag_of

    field, sep, rest = text.partition(": ")
    if not sep or not field.isidentifier():
        return text
    flag = flag_of(field) or f"--{field.replace('_', '-')}"
    options = {opt for parser in _subparsers(build_parser()) for action in parser._actions for opt in action.option_strings}
    return f"{flag}: {rest}" if flag in options else text


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for action in parser._actions if isinstance(action, argparse._SubParsersAction) for p in action.choices.values()]


def _models() -> int:
    """One row per registered card (the *-demo ones first), under a header."""
    from vidloom import registry

    rows = [("ID", "FAMILY", "TASKS", "WHAT IT IS")]
    for card in registry.list_cards():
        tasks = [t.value for t in sorted(card.tasks)] + (["chat"] if "ar_decode" in card.loops else []) + (
            ["speech"] if card.speech is not None else [])
        rows.append((card.model_id, card.family, ",".join(tasks), card.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)) + "  " + row[3])
    return 0


def _serve(args: argparse.Namespace, argv: list[str], guard: InterruptGuard) -> int:
    from vidloom import registry
    from vidloom.cli.generate import check_device, quiet_third_party
    from vidloom.serving.deploy_card import dump_card
    from vidloom.serving.serve_flags import effective_config, typed_flags
    from vidloom.serving.server import BindError, serve

    if args.model_arg is not None and args.model is not None and args.model_arg != args.model:
        raise InvalidRequest("model", f"given twice: {args.model_arg!r} and --model {args.model!r}; give one")
    quiet_third_party(args.verbose)
    place = _torchrun_place()
    try:  # defaults < deployment card < $VIDLOOM_API_KEY < typed flags
        config = effective_config(args, typed_flags(build_parser(), argv), place.world_size if place else None)
    except ValueError as exc:
        print(f"error: {_flagged(_one_line(str(exc)))}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_config:
        print(dump_card(config, "# vidloom deployment card (effective settings)\n"), end="")
        return 0
    if place is not None and place.rank != 0:
        return _follow(config.model, args, config.deploy)
    check_data_dir(config.data_dir)
    check_device(config.device)
    for note in registry.resolve_card(config.model).notes:
        say(f"note: {note}")
    listening: list[bool] = []
    try:
        serve(config, on_listening=lambda: listening.append(True))
    except BindError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # uvicorn drains, then raises the SIGINT it caught again
        if not listening:
            raise  # a Ctrl-C during the load: cancelled
    if listening:
        guard.forgive()  # Ctrl-C is how a running server stops: its shutdown log says so, no `cancelled`
    return 0


def check_data_dir(data_dir: Path) -> None:
    """The job database and videos must be writable before the model loads and "serving on" is printed."""
    import tempfile

    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        raise InvalidRequest("data_dir", f"cannot use {data_dir} for the job database: {exc.strerror or exc}") from None


def _torchrun_place() -> RankPlace | None:
    """This process's rank and world size when a launcher (torchrun) started it; None otherwise."""
    if "WORLD_SIZE" not in os.environ:  # no launcher (it sets this and more): spare importing torch.distributed
        return None
    from vidloom.runtime.parallel.launch import torchrun_place

    return torchrun_place()


def _follow(model: str, args: argparse.Namespace, deploy: DeployConfig) -> int:
    """A torchrun rank other than 0: serve rank 0's commands; rank 0 writes the output (or serves HTTP)."""
    from vidloom.generator_load import follow_torchrun

    return 0 if follow_torchrun(model, device=args.device, dtype=args.dtype, deploy=deploy) else 1
