"""`vidloom parity --model DIR`: run vidloom and the folder's diffusers pipeline, report the first divergence.

Exit status: 0 when every compared tap is within tolerance, 1 at a divergence, 2 for a usage error
(including a missing diffusers or a pipeline with no parity map).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from vidloom.core.errors import InvalidRequest

if TYPE_CHECKING:
    from vidloom.core.request import GenerationRequest

EXIT_DIVERGED = 1
EXIT_USAGE = 2
DEFAULT_MAX_TOKENS = 16  # an autoregressive model's reply: enough ids to show where two decoders part
# The settings' names in TapFilter / Tolerance errors -> the flags that set them.
_FLAGS = {"taps": "--taps", "tap_steps": "--tap-steps", "tap_budget": "--tap-budget-mb", "tolerance": "--atol/--rtol"}


def add_parity_parser(sub: argparse._SubParsersAction) -> None:
    par = sub.add_parser("parity", help="compare vidloom with the reference pipeline, tap by tap (needs diffusers)")
    par.add_argument("--model", required=True,
                     help="diffusers checkpoint dir (or registered id): both vidloom and its own pipeline load it")
    par.add_argument("--prompt", default="a red fox jumps over a frozen river", help="the request's prompt")
    par.add_argument("--negative-prompt", default=None, help="card default")
    par.add_argument("--steps", type=int, default=None, help="denoise steps (card default)")
    par.add_argument("--seed", type=int, default=0, help="noise seed (default: 0)")
    par.add_argument("--height", type=int, default=None, help="pixels (card default)")
    par.add_argument("--width", type=int, default=None, help="pixels (card default)")
    par.add_argument("--frames", type=int, default=None, help="frame count (video models)")
    par.add_argument("--guidance", type=float, default=None, help="CFG scale (card default)")
    par.add_argument("--shift", type=float, default=None, help="flow shift (card default)")
    par.add_argument("--sampler", default=None, help="unipc | euler (card default)")
    par.add_argument("--two-stage", action="store_true",
                     help="multi-stage models (LTX-2): compare the two-stage chain (generate, upsample, refine)")
    par.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                     help=f"autoregressive models (Qwen2.5-Omni): reply tokens at most (default: {DEFAULT_MAX_TOKENS})")
    par.add_argument("--device", default="cpu", help="both sides run here, in float32 (default: cpu)")
    par.add_argument("--atol", type=float, default=None,
                     help="absolute tolerance per tap (default: the family's, else 1e-4)")
    par.add_argument("--rtol", type=float, default=None,
                     help="relative tolerance, times the reference tap's max |value| (default: the family's, else 1e-4)")
    par.add_argument("--taps", default=None, metavar="KIND,...",
                     help="tap kinds to record: stage, input, block, output, latents, token (default: all)")
    par.add_argument("--tap-steps", default=None, metavar="N,...", help="steps to record (default: all)")
    par.add_argument("--tap-budget-mb", type=float, default=512.0,
                     help="memory the taps of one side may take; recording stops past it (default: 512)")
    par.add_argument("--rows", type=int, default=40, help="steps shown in the table (default: 40)")
    par.add_argument("--verbose", action="store_true", help="show third-party loading bars and logs")


def parity_command(args: argparse.Namespace) -> int:
    """Raises InvalidRequest / VidloomError for the CLI's one-line error path."""
    from vidloom.cli.generate import quiet_third_party
    from vidloom.parity import TapFilter, Tolerance, run_parity
    from vidloom.parity.reference import require_diffusers
    from vidloom.parity.run import checkpoint_dir
    from vidloom.parity.sequences import sequence_family_for

    sequence = sequence_family_for(checkpoint_dir(args.model))
    if sequence is None:
        require_diffusers()
    elif args.max_tokens < 1:
        raise InvalidRequest("--max-tokens", f"must be >= 1, got {args.max_tokens}")
    quiet_third_party(args.verbose)
    try:
        keep = TapFilter(**_filter_fields(args))
        tolerance = None  # the family's stated one
        if args.atol is not None or args.rtol is not None:
            default = Tolerance()
            tolerance = Tolerance(default.atol if args.atol is None else args.atol,
                                  default.rtol if args.rtol is None else args.rtol)
    except ValueError as exc:
        field, _, message = str(exc).partition(": ")
        raise InvalidRequest(_FLAGS.get(field, field), message) from None
    request = _request(args) if sequence is None else sequence.build_request(args.prompt, args.seed, args.max_tokens)
    result = run_parity(args.model, request, tolerance=tolerance, taps=keep, device=args.device,
                        two_stage=args.two_stage)
    if sequence is not None:
        print(sequence.describe(result.request))
    else:
        print(f"request: seed {result.request.seed}, {result.request.num_inference_steps} steps, "
              f"{result.request.width}x{result.request.height}, guidance {result.request.guidance_scale}")
    print(result.report.format(rows=args.rows))
    sys.stdout.flush()
    return 0 if result.report.ok else EXIT_DIVERGED


def _filter_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_bytes": int(args.tap_budget_mb * (1 << 20))}
    if args.taps is not None:
        fields["kinds"] = frozenset(k.strip() for k in args.taps.split(",") if k.strip())
    if args.tap_steps is not None:
        try:
            fields["steps"] = frozenset(int(s) for s in args.tap_steps.split(",") if s.strip())
        except ValueError:
            raise ValueError(f"tap_steps: expected step numbers like 0,2, got {args.tap_steps!r}") from None
    return fields


def _request(args: argparse.Namespace) -> GenerationRequest:
    from vidloom import registry
    from vidloom.generator import build_request

    fields = {
        "negative_prompt": args.negative_prompt, "num_inference_steps": args.steps, "seed": args.seed,
        "height": args.height, "width": args.width, "num_frames": args.frames, "guidance_scale": args.guidance,
        "flow_shift": args.shift, "sampler": args.sampler,
    }
    given = {name: value for name, value in fields.items() if value is not None}
    return build_request(registry.resolve_card(args.model), args.prompt, **given)
