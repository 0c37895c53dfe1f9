"""Checks of a ParallelPlan against the model and against each request, run in the parent process.

Load-time checks raise DeployError before any worker process starts; request checks raise
InvalidRequest at submit, before the request reaches a worker. The plan itself (degrees,
world size) is checked when DeployConfig is built (vidloom.core.deploy).
"""

from __future__ import annotations

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.parallel import ParallelPlan, SequenceGeometry, TokenLayout
from vidloom.core.request import GenerationRequest

__all__ = ["ParallelPlan", "SequenceGeometry", "TokenLayout", "check_model", "check_request",
           "check_step_cache", "check_warmup", "sp_attention"]

def check_model(plan: ParallelPlan, layout: TokenLayout) -> None:
    """A layout whose CFG does not split refuses --cfg-parallel with its reason. Any sp runs: Ulysses where sp
    divides the heads, ring attention where it does not (`sp_attention` says which)."""
    if plan.text_encoder_rank is not None and not layout.prompt_nodes:
        raise DeployError("parallel.text_encoder_rank (--text-encoder-rank): this model encodes no prompt in a node of "
                          "its own (Family.token_layout's prompt_nodes); deploy without --text-encoder-rank")
    if plan.cfg > 1 and layout.cfg_parallel is not None:
        raise DeployError(f"--cfg-parallel: {layout.cfg_parallel}; deploy without --cfg-parallel")
    if plan.cfg > layout.cfg_passes:
        raise DeployError(f"--cfg-parallel {plan.cfg}: this model's steps run at most {layout.cfg_passes} guidance "
                          f"passes, one per rank of the group; use --cfg-parallel {layout.cfg_passes} or less")
    if layout.split == "rows" and layout.num_heads % plan.sp:
        raise DeployError(f"--sp {plan.sp}: this model's self-attention is linear attention over its "
                          f"{layout.num_heads} heads, which sequence parallel splits by head (ring attention is "
                          f"softmax attention), so --sp must divide {layout.num_heads}")


def check_step_cache(deploy: DeployConfig, layout: TokenLayout) -> None:
    """Under --sp a step cache's change measures sum over the ranks' token shards (RankShare); a padded layout's
    pad rows would enter those sums, so it is refused there until the measure masks them."""
    if deploy.parallel.sp > 1 and deploy.step_cache != "none" and layout.split == "pad":
        raise DeployError(
            f"step_cache={deploy.step_cache!r} with --sp {deploy.parallel.sp}: this model's token stream is padded "
            "to split, and the pad rows would enter the cache's change measure; use --step-cache with "
            "--cfg-parallel alone, or --sp without a step cache"
        )


def sp_attention(plan: ParallelPlan, layout: TokenLayout) -> str:
    """How self-attention sees every token under `plan`: "ulysses" (sp divides the heads: each rank attends
    heads/sp whole heads) or "ring" (keys and values pass around the ranks; any head count)."""
    return "ulysses" if layout.num_heads % plan.sp == 0 else "ring"


def check_request(plan: ParallelPlan, layout: TokenLayout, request: GenerationRequest) -> None:
    """Raise InvalidRequest naming the field when a resolved request cannot run under `plan`."""
    if plan.cfg > 1 and not request.uses_cfg:
        raise InvalidRequest(
            "guidance_scale",
            f"{request.guidance_scale} turns classifier-free guidance off (it needs > 1), but this deployment runs "
            "the two guidance branches on two devices (--cfg-parallel); use guidance_scale > 1, or deploy without "
            "--cfg-parallel",
        )
    if plan.cfg > 1 and "negative_prompt" in layout.cfg_needs and not request.negative_prompt:
        raise InvalidRequest(
            "negative_prompt",
            "this model runs CFG only with a non-empty negative prompt, but this deployment runs the two guidance "
            "branches on two devices (--cfg-parallel); give a negative_prompt (\" \" will do), or deploy without "
            "--cfg-parallel",
        )
    if layout.grid is None:
        return  # a padded layout runs any token count
    problem = _token_problem(plan, layout.grid, request.height, request.width, request.num_frames, layout.split)
    if problem is not None:
        raise InvalidRequest("num_frames" if request.num_frames > 1 and layout.split == "even" else "height", problem)


def check_warmup(deploy: DeployConfig, layout: TokenLayout) -> None:
    """Warmup shapes run at load on every rank, so they follow the request rules too."""
    if layout.grid is None:
        return
    for height, width, num_frames in deploy.warmup_shapes:
        problem = _token_problem(deploy.parallel, layout.grid, height, width, num_frames, layout.split)
        if problem is not None:
            raise DeployError(f"warmup_shapes entry {height}x{width}x{num_frames}: {problem}")


def _token_problem(
    plan: ParallelPlan, geometry: SequenceGeometry, height: int, width: int, num_frames: int, split: str = "even"
) -> str | None:
    # An "even" layout (Wan) does not pad: its sequence must split evenly. Sizes are the caller's choice,
    # and the message says how.
    f, h, w = geometry.patch_grid(height, width, num_frames)
    if split == "rows":
        if h % plan.sp == 0:
            return None
        return (f"{height}x{width} is {h} patch rows per frame, which sequence parallel (sp={plan.sp}) splits into "
                f"bands of rows; pick a height whose patch rows (height/{geometry.vae_spatial * geometry.patch_size[1]}) "
                f"are a multiple of {plan.sp}")
    if (f * h * w) % plan.sp == 0:
        return None
    return (
        f"{height}x{width} with {num_frames} frames is a {f}x{h}x{w} patch grid = {f * h * w} video tokens, which "
        f"sequence parallel (sp={plan.sp}) cannot split evenly; vidloom does not pad, so pick height, width and "
        f"num_frames whose token count (latent frames x height/{geometry.vae_spatial * geometry.patch_size[1]} x "
        f"width/{geometry.vae_spatial * geometry.patch_size[2]}) is a multiple of {plan.sp}"
    )
