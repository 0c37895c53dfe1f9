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
from vidloom.cli.interrupt import EXIT_INTERRUPTED, InterruptGuard
from vidloom.core.errors import InvalidRequest, VidloomError
from vidloom.runtime.scheduler import DEFAULT_DECODE_SLOTS

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
                          "(start-up, checks, checkpoint, weights, warmup, generation, write)")
    add_option_arguments(gen)
    add_action_arguments(gen)
    add_deploy_arguments(gen)

    add_chat_parser(sub, DTYPES)
    add_speak_parser(sub, DTYPES)
    models = sub.add_parser("models", help="list registered model cards")
    models.add_argument("--capabilities", action="store_true",
                        help="print which deploy features each kind of checkpoint supports (from the cards)")
    _add_serve_parser(sub)
    from vidloom.fleet.cli import add_fleet_parser

    add_fleet_parser(sub)
    add_parity_parser(sub)
    return parser


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from vidloom import registry
    from vidloom.cli.deploy_args import add_deploy_arguments

    srv = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    srv.add_argument("--config", default=None, metavar="CARD.yaml",
                     help="deployment card: YAML with any setting below (and more); flags you type override it")
    srv.add_argument("--print-config", action="store_true", help="print the effective deployment card and exit")
    srv.add_argument("model_arg", nargs="?", default=None, metavar="MODEL",
                     help="registered id, diffusers checkpoint dir or Hugging Face repo id (same as --model)")
    srv.add_argument("--model", default=None,
                     help=f"registered id, diffusers checkpoint dir or Hugging Face repo id "
                          f"(default: {registry.DEFAULT_MODEL})")
    srv.add_argument("--served-model-name", default=None, metavar="NAME",
                     help="model name clients send and see in /v1/models (default: the card's id)")
    srv.add_argument("--lora", action="append", default=None, metavar="NAME=PATH",
                     help="a LoRA adapter to load at start, chosen per request by its name (repeatable); "
                          "NAME=PATH[:SCALE] with --fuse-loras")
    srv.add_argument("--fuse-loras", action="store_true",
                     help="add the --lora adapters into the base weights at load (faster steps; requests may "
                          "name no other adapters, runtime load/unload refused)")
    srv.add_argument("--max-loras", type=int, default=None, metavar="N",
                     help="LoRA adapters resident at once (default: 4)")
    srv.add_argument("--lora-dir", action="append", default=None, metavar="DIR",
                     help="a folder POST /v1/loras may load adapter files from (repeatable; none: run-time "
                          "loading is off)")
    srv.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                     help="largest adapter rank POST /v1/loras accepts (default: 1024)")
    srv.add_argument("--max-lora-mb", type=float, default=None, metavar="MB",
                     help="largest adapter file POST /v1/loras reads (default: 4096)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default: 8000)")
    srv.add_argument("--slots", type=int, default=1, help="requests resident on the device at once (default: 1)")
    srv.add_argument("--queue-size", type=int, default=16, help="requests that may wait; more get 429 (default: 16)")
    srv.add_argument("--decode-slots", type=int, default=DEFAULT_DECODE_SLOTS, metavar="N",
                     help="chats (AR sequences) decoding in one batched step at most; more wait in the queue "
                          f"(default: {DEFAULT_DECODE_SLOTS})")
    srv.add_argument("--policy", default="fifo",
                     help="fifo | interleave | batch (compatible steps of resident requests share a forward) (default: fifo)")
    srv.add_argument("--max-batch", type=int, default=None, help="batch policy: requests per forward (default: --slots)")
    srv.add_argument("--batch-wait-ms", type=float, default=0.0,
                     help="batch policy: wait up to this long for more requests before a step with room (default: 0)")
    srv.add_argument("--data-dir", default="vidloom-data", help="job database and videos (default: ./vidloom-data)")
    srv.add_argument("--store", default=None, metavar="URL",
                     help="job table: sqlite (default, in --data-dir) or postgresql://USER@HOST/DB (shared)")
    srv.add_argument("--lost-jobs", default="fail", choices=("fail", "requeue"),
                     help="jobs of a server that died: fail them, or requeue them for a live server (default: fail)")
    srv.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    srv.add_argument("--dtype", default=None, choices=DTYPES, help="float32 | bfloat16 | float16")
    srv.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs")
    _add_limit_arguments(srv)
    add_deploy_arguments(srv)
    _add_serve_security_arguments(srv)


def _add_serve_security_arguments(srv: argparse.ArgumentParser) -> None:
    """Who may call the server, and how it stops (ServeConfig's security block, plus graceful_shutdown_s)."""
    from vidloom.serving.api_keys import API_KEY_ENV

    srv.add_argument("--api-key", default=None, metavar="KEY",
                     help=f"require 'Authorization: Bearer KEY' on every route but /health "
                          f"(default: ${API_KEY_ENV}; unset = no authentication)")
    srv.add_argument("--api-keys-file", default=None, metavar="FILE",
                     help="several API keys, one 'KEY ROLE OWNER' a line (ROLE: admin | user) or a JSON list of "
                          "{key, role, owner}; each key sees only its owner's jobs and sessions")
    srv.add_argument("--metrics-need-key", action="store_true", help="require the API key on /metrics too")
    srv.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                     help="accept this Host name besides the bind address, localhost and IP literals; "
                          "repeatable; '*' accepts any")
    srv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="let a web app at ORIGIN (e.g. https://app.example.com) call the API; repeatable")
    srv.add_argument("--enable-docs", action="store_true", help="serve /docs, /redoc and /openapi.json")
    srv.add_argument("--ui", action=argparse.BooleanOptionalAction, default=None,
                     help="the web playground at / (default: on when bound to loopback); --no-ui turns it off")
    srv.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS",
                     help="on SIGTERM, running jobs get this long to finish before they fail (default: 5)")


def _add_limit_arguments(srv: argparse.ArgumentParser) -> None:
    """Per-request work limits and connection bounds (ServeConfig); unset limits derive from the model card."""
    lim = srv.add_argument_group("request and connection limits")
    lim.add_argument("--max-pixels", type=int, default=None, help="width*height per frame (default: 4x the card's size)")
    lim.add_argument("--max-frames", type=int, default=None, help="frames per video (default: 4x the card's)")
    lim.add_argument("--max-steps", type=int, default=None, help="denoise steps (default: 20x the card's)")
    lim.add_argument("--max-prompt-chars", type=int, default=None, help="prompt length (default: from the text encoder)")
    lim.add_argument("--max-request-memory-gb", type=float, default=None,
                     help="estimated peak memory per request (default: the runtime's budget, 90%% of what is free "
                          "after loading, shared by the running requests)")
    lim.add_argument("--max-body-mb", type=float, default=1.0,
                     help="request body size in MiB, image uploads included; larger get 413 (default: 1)")
    lim.add_argument("--max-init-audio-seconds", type=float, default=None,
                     help="longest init_audio upload to /v1/audio/generations, seconds (default: the model's window)")
    lim.add_argument("--max-request-seconds", type=float, default=300.0,
                     help="wall time of one speech run (speech, chats answered aloud): refused up front at the "
                          "measured pace, stopped with a 504 past it (default: 300)")
    lim.add_argument("--max-chat-media-bytes", type=int, default=32 << 20,
                     help="what one chat's audio and image parts decode to, from their headers (default: 32 MiB)")
    lim.add_argument("--chat-media-budget-bytes", type=int, default=128 << 20,
                     help="decoded media of the chats being prepared at once; past it a 429 (default: 128 MiB)")
    lim.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send a request head (default: 10)")
    lim.add_argument("--keep-alive-timeout", type=float, default=5.0, help="idle keep-alive seconds (default: 5)")
    lim.add_argument("--max-connections", type=int, default=256,
                     help="open API connections; at the cap the one idle longest is closed, and if all are busy "
                          "new ones may call /health and /metrics only (default: 256)")
    lim.add_argument("--probe-connections", type=int, default=16,
                     help="connections reserved for /health and /metrics past --max-connections; "
                          "also the cap of --health-port (default: 16)")
    lim.add_argument("--health-port", type=int, default=None, metavar="PORT",
                     help="also serve /health and /metrics (only) on this port, apart from API clients")


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
        print(f"note: {note}", file=sys.stderr)
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
    from vidloom.generator import follow_torchrun

    return 0 if follow_torchrun(model, device=args.device, dtype=args.dtype, deploy=deploy) else 1
