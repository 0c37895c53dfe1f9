"""The `vidloom` command: generate | serve | models."""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.deploy_args import add_deploy_arguments, deploy_config
from vidloom.core.errors import VidloomError
from vidloom.core.output import Event, ProgressEvent

if TYPE_CHECKING:
    from vidloom.runtime.parallel.worker import RankPlace

API_KEY_ENV = "VIDLOOM_API_KEY"  # the API key from the environment keeps it out of `ps` listings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidloom", description="Video generation inference runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate one video")
    gen.add_argument("--model", default=registry.DEFAULT_MODEL,
                     help=f"registered id or diffusers checkpoint dir (default: {registry.DEFAULT_MODEL}, random weights)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--negative-prompt", default=None)
    gen.add_argument("--output", default="out.mp4", help="where to write the .mp4 (default: out.mp4)")
    gen.add_argument("--steps", type=int, default=None, help="denoise steps (card default)")
    gen.add_argument("--seed", type=int, default=None, help="noise seed (random if unset; printed)")
    gen.add_argument("--height", type=int, default=None)
    gen.add_argument("--width", type=int, default=None)
    gen.add_argument("--frames", type=int, default=None, help="frame count; Wan needs 4k+1")
    gen.add_argument("--fps", type=int, default=None)
    gen.add_argument("--guidance", type=float, default=None, help="CFG scale; <= 1 turns CFG off")
    gen.add_argument("--shift", type=float, default=None, help="flow shift (card default)")
    gen.add_argument("--sampler", default=None, help="unipc | euler (card default)")
    gen.add_argument("--image", default=None, metavar="FILE", help="first frame: image-to-video (I2V cards)")
    gen.add_argument("--last-image", default=None, metavar="FILE", help="last frame too (first-last-frame cards)")
    gen.add_argument("--video", default=None, metavar="FILE", help="input video: video-to-video (T2V cards)")
    gen.add_argument("--strength", type=float, default=None, help="video-to-video: how much to change, in (0, 1]")
    gen.add_argument("--guidance-2", type=float, default=None, help="two-expert models: low-noise expert's CFG scale")
    gen.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    gen.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: card's on CUDA, float32 on CPU)")
    add_deploy_arguments(gen)

    sub.add_parser("models", help="list registered model cards")
    _add_serve_parser(sub)
    return parser


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    srv.add_argument("--model", default=registry.DEFAULT_MODEL,
                     help=f"registered id or diffusers checkpoint dir (default: {registry.DEFAULT_MODEL})")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default: 8000)")
    srv.add_argument("--slots", type=int, default=1, help="requests resident on the device at once (default: 1)")
    srv.add_argument("--queue-size", type=int, default=16, help="requests that may wait; more get 429 (default: 16)")
    srv.add_argument("--policy", default="fifo", help="fifo | interleave (default: fifo)")
    srv.add_argument("--data-dir", default="vidloom-data", help="job database and videos (default: ./vidloom-data)")
    srv.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    srv.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    _add_limit_arguments(srv)
    add_deploy_arguments(srv)
    _add_serve_security_arguments(srv)


def _add_serve_security_arguments(srv: argparse.ArgumentParser) -> None:
    """Who may call the server, and how it stops (ServeConfig's security block, plus graceful_shutdown_s)."""
    srv.add_argument("--api-key", default=None, metavar="KEY",
                     help=f"require 'Authorization: Bearer KEY' on every route but /health "
                          f"(default: ${API_KEY_ENV}; unset = no authentication)")
    srv.add_argument("--metrics-need-key", action="store_true", help="require the API key on /metrics too")
    srv.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                     help="accept this Host name besides the bind address, localhost and IP literals; "
                          "repeatable; '*' accepts any")
    srv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="let a web app at ORIGIN (e.g. https://app.example.com) call the API; repeatable")
    srv.add_argument("--enable-docs", action="store_true", help="serve /docs, /redoc and /openapi.json")
    srv.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS",
                     help="on SIGTERM, running jobs get this long to finish before they fail (default: 5)")


def _serve_security_settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "api_key": args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None),
        "metrics_need_key": args.metrics_need_key, "allowed_hosts": tuple(args.allowed_host),
        "cors_origins": tuple(args.cors_origin), "enable_docs": args.enable_docs,
        "graceful_shutdown_s": args.shutdown_grace,
    }


def _add_limit_arguments(srv: argparse.ArgumentParser) -> None:
    """Per-request work limits and connection bounds (ServeConfig); unset limits derive from the model card."""
    lim = srv.add_argument_group("request and connection limits")
    lim.add_argument("--max-pixels", type=int, default=None, help="width*height per frame (default: 4x the card's size)")
    lim.add_argument("--max-frames", type=int, default=None, help="frames per video (default: 4x the card's)")
    lim.add_argument("--max-steps", type=int, default=None, help="denoise steps (default: 20x the card's)")
    lim.add_argument("--max-prompt-chars", type=int, default=None, help="prompt length (default: from the text encoder)")
    lim.add_argument("--max-request-memory-gb", type=float, default=None,
                     help="estimated peak memory per request (default: 90%% of free memory / slots)")
    lim.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send a request head (default: 10)")
    lim.add_argument("--keep-alive-timeout", type=float, default=5.0, help="idle keep-alive seconds (default: 5)")
    lim.add_argument("--max-connections", type=int, default=256, help="open connections; more get 503 (default: 256)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "models":
            return _models()
        if args.command == "serve":
            return _serve(args)
        return _generate(args)
    except VidloomError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _models() -> int:
    for card in registry.list_cards():
        print(f"{card.model_id:<24} {card.family:<8} {','.join(t.value for t in sorted(card.tasks)):<8} {card.description}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from vidloom.serving.config import ServeConfig
    from vidloom.serving.server import BindError, serve

    place = _torchrun_place()
    try:
        config = ServeConfig(
            model=args.model, host=args.host, port=args.port, slots=args.slots, queue_size=args.queue_size,
            policy=args.policy, data_dir=Path(args.data_dir), device=args.device, dtype=args.dtype,
            deploy=deploy_config(args, place.world_size if place else None), **_serve_security_settings(args),
            max_pixels=args.max_pixels, max_frames=args.max_frames, max_steps=args.max_steps,
            max_prompt_chars=args.max_prompt_chars,
            max_request_memory_bytes=None if args.max_request_memory_gb is None else int(args.max_request_memory_gb * 2**30),
            header_timeout_s=args.header_timeout, keep_alive_timeout_s=args.keep_alive_timeout,
            max_connections=args.max_connections,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if place is not None and place.rank != 0:
        return _follow(args, config.deploy)
    for note in registry.resolve_card(args.model).notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        serve(config)
    except BindError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _generate(args: argparse.Namespace) -> int:
    from vidloom.generator import VideoGenerator

    place = _torchrun_place()
    deploy = deploy_config(args, place.world_size if place else None)  # a bad plan fails here, before any process starts
    if place is not None and place.rank != 0:
        return _follow(args, deploy)
    card = registry.resolve_card(args.model)
    for note in card.notes:
        print(f"note: {note}", file=sys.stderr)
    started = time.perf_counter()
    with VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype, deploy=deploy) as generator:
        with _ProgressBars() as bars:
            video = generator.generate(
                args.prompt, negative_prompt=args.negative_prompt, height=args.height, width=args.width,
                num_frames=args.frames, fps=args.fps, num_inference_steps=args.steps, guidance_scale=args.guidance,
                flow_shift=args.shift, sampler=args.sampler, seed=args.seed, on_event=bars, image=args.image,
                last_image=args.last_image, video=args.video, strength=args.strength, guidance_scale_2=args.guidance_2,
            )
    path = video.save(Path(args.output))
    meta = video.metadata
    print(
        f"wrote {path.resolve()}  ({meta['num_frames']} frames {meta['width']}x{meta['height']} @ {meta['fps']} fps, "
        f"seed {meta['seed']}, {meta['sampler']} x{meta['num_inference_steps']})"
    )
    print(f"wall time {time.perf_counter() - started:.1f}s (generation {meta['elapsed_s']:.1f}s), peak memory {_peak_memory()}")
    return 0


def _torchrun_place() -> RankPlace | None:
    """This process's rank and world size when a launcher (torchrun) started it; None otherwise."""
    from vidloom.runtime.parallel.launch import torchrun_place

    return torchrun_place()


def _follow(args: argparse.Namespace, deploy: DeployConfig) -> int:
    """A torchrun rank other than 0: serve rank 0's commands; rank 0 writes the output (or serves HTTP)."""
    from vidloom.generator import follow_torchrun

    return 0 if follow_torchrun(args.model, device=args.device, dtype=args.dtype, deploy=deploy) else 1


class _ProgressBars:
    """One tqdm bar per phase (denoise, decode), fed by the engine's progress events."""

    def __init__(self) -> None:
        self._bars: dict = {}

    def __enter__(self) -> "_ProgressBars":
        return self

    def __call__(self, event: Event) -> None:
        from tqdm import tqdm

        if not isinstance(event, ProgressEvent):
            return
        bar = self._bars.get(event.phase)
        if bar is None:
            bar = self._bars[event.phase] = tqdm(total=event.total, desc=event.phase, unit="step", file=sys.stderr)
        bar.update(event.step - bar.n)

    def __exit__(self, *exc: object) -> None:
        for bar in self._bars.values():
            bar.close()


def _peak_memory() -> str:
    import torch

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    text = f"{rss_mib:.0f} MiB RSS"
    if torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0:
        text += f", {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB CUDA"
    return text


if __name__ == "__main__":
    sys.exit(main())
