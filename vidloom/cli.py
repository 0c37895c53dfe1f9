"""The `vidloom` command: generate | models."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from vidloom import registry
from vidloom.deploy_args import add_deploy_arguments, deploy_config
from vidloom.core.errors import VidloomError
from vidloom.core.output import Event, ProgressEvent


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
    gen.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    gen.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: card's on CUDA, float32 on CPU)")
    add_deploy_arguments(gen)

    sub.add_parser("models", help="list registered model cards")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "models":
            return _models()
        return _generate(args)
    except VidloomError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _models() -> int:
    for card in registry.list_cards():
        print(f"{card.model_id:<18} {card.family:<8} {','.join(t.value for t in sorted(card.tasks)):<5} {card.description}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from vidloom.generator import VideoGenerator

    card = registry.resolve_card(args.model)
    for note in card.notes:
        print(f"note: {note}", file=sys.stderr)
    started = time.perf_counter()
    generator = VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype, deploy=deploy_config(args))
    with _ProgressBars() as bars:
        video = generator.generate(
            args.prompt, negative_prompt=args.negative_prompt, height=args.height, width=args.width,
            num_frames=args.frames, fps=args.fps, num_inference_steps=args.steps, guidance_scale=args.guidance,
            flow_shift=args.shift, sampler=args.sampler, seed=args.seed, on_event=bars,
        )
    path = video.save(Path(args.output))
    meta = video.metadata
    print(
        f"wrote {path.resolve()}  ({meta['num_frames']} frames {meta['width']}x{meta['height']} @ {meta['fps']} fps, "
        f"seed {meta['seed']}, {meta['sampler']} x{meta['num_inference_steps']})"
    )
    print(f"wall time {time.perf_counter() - started:.1f}s (generation {meta['elapsed_s']:.1f}s), peak memory {_peak_memory()}")
    return 0


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
