"""Command-line flags for DeployConfig, shared by `vidloom generate` and `vidloom serve`."""

from __future__ import annotations

import argparse
import re

from vidloom.core.deploy import COMPILE_BACKENDS, DeployConfig


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("deployment (performance and memory)")
    group.add_argument("--fp8", action="store_true", help="FP8 (e4m3) weights for the DiT block linears")
    group.add_argument("--compile", action="store_true", help="torch.compile the DiT blocks")
    group.add_argument("--compile-backend", default="inductor", choices=COMPILE_BACKENDS)
    group.add_argument("--warmup", action="append", default=[], metavar="HxWxF", type=_shape,
                       help="run a short request at this size at load (repeatable), e.g. 480x832x81")
    group.add_argument("--offload-text-encoder", action="store_true",
                       help="keep the text encoder in CPU memory between encodes")
    group.add_argument("--prompt-cache", type=int, default=0, metavar="N", help="cache N prompt embeddings")
    group.add_argument("--vae-tile", type=int, default=None, metavar="PIXELS", help="decode in spatial tiles")


def deploy_config(args: argparse.Namespace) -> DeployConfig:
    return DeployConfig(
        fp8_weights=args.fp8,
        compile=args.compile,
        compile_backend=args.compile_backend,
        warmup_shapes=tuple(args.warmup),
        offload_text_encoder=args.offload_text_encoder,
        prompt_cache_size=args.prompt_cache,
        vae_tile=args.vae_tile,
    )


def _shape(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTHxFRAMES like 480x832x81, got {text!r}")
    height, width, frames = (int(g) for g in match.groups())
    return height, width, frames
