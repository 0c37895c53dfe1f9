"""The runtime's per-step overhead: vidloom's Engine driving the denoise loop vs a bare Python loop.

Both run the same DiT forward (classic CFG) and the same sampler step on the same
inputs. Two measurements:
- driver: the network replaced by a no-op, so only the loop machinery runs (plan
  building, RequestRun's execute/progress/cancellation, the sampler step in both);
  the per-step difference is the runtime's cost, in microseconds, set against the
  real mid step time.
- end to end: the real mid DiT, a few steps, alternating bare/engine, medians.
Target: overhead < 2% of the step time at the mid size.

    python bench/overhead.py [--size mid] [--runs 3] [--steps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Mapping

import torch

from checkpoints import SIZES, ensure_checkpoint
from report import environment, print_table, wait_for_quiet, write_json
from vidloom.core.deploy import DeployConfig
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest
from vidloom.diffusion.guidance import SequentialCFG, cfg_combine
from vidloom.diffusion.sampler import make_sampler
from vidloom.generator import VideoGenerator
from vidloom.families.wan.loop import WanDenoiseLoop
from vidloom.runtime.engine import Engine

Network = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _inputs(gen: VideoGenerator, request: GenerationRequest) -> dict[str, Any]:
    """Slots the denoise loop reads, computed once so both loops start from the same tensors."""
    engine = gen.engine
    run = engine.submit(request)
    slots: dict[str, Any] = {"request": run.request}
    for node in engine.program.nodes:
        if node.loop is not None:
            break
        slots.update(node.run({k: slots[k] for k in node.reads}, run))  # type: ignore[misc]
    run.close()
    return slots


def bare_loop(network: Network, slots: Mapping[str, Any], sampler_config: Any) -> torch.Tensor:
    """What a hand-written script does: the same forward, CFG rule and sampler step, no runtime."""
    request = slots["request"]
    sampler = make_sampler(request.sampler, sampler_config.with_shift(request.flow_shift))
    schedule = sampler.schedule(request.num_inference_steps)
    state = sampler.init_state(schedule)
    latents, pe, ne = slots["latents"], slots["prompt_embeds"], slots["negative_embeds"]
    with torch.inference_mode():
        for i, t in enumerate(schedule.timesteps):
            ts = t.expand(latents.shape[0])
            velocity = cfg_combine(network(latents, ts, pe), network(latents, ts, ne), request.guidance_scale)
            latents = sampler.step(state, i, velocity, latents)
    return latents


def engine_loop(network: Any, slots: Mapping[str, Any], gen: VideoGenerator) -> torch.Tensor:
    """The same loop driven by the runtime: a program of (given inputs) -> denoise."""
    instance = gen.engine.instance
    loop = WanDenoiseLoop(network, instance["sampler_config"], instance.dtype, SequentialCFG())
    given = {k: slots[k] for k in ("latents", "prompt_embeds", "negative_embeds")}
    program = Program(
        nodes=(
            Node("given", reads=("request",), writes=tuple(given), run=lambda s, ctx: given),
            Node("denoise", reads=("request", *given), writes=("latents",), loop=loop),
        ),
        inputs=frozenset({"request"}),
        outputs=("latents",),
    )
    return Engine(instance, program).run(slots["request"])["latents"]


def _noop(latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    return latents


def _alternate(runs: int, bare: Callable[[], Any], engine: Callable[[], Any]) -> tuple[list[float], list[float]]:
    times: dict[str, list[float]] = {"bare": [], "engine": []}
    for r in range(runs):
        order = [("bare", bare), ("engine", engine)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            wait_for_quiet()
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return times["bare"], times["engine"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mid", choices=[s for s in SIZES if not SIZES[s].needs_cuda])
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each loop (end to end)")
    parser.add_argument("--steps", type=int, default=4, help="denoise steps per end-to-end run")
    parser.add_argument("--driver-steps", type=int, default=500, help="steps per no-op driver run")
    args = parser.parse_args()
    size = SIZES[args.size]
    gen = VideoGenerator.from_pretrained(ensure_checkpoint(args.size), device="cpu", deploy=DeployConfig())
    transformer = gen.engine.instance["transformer"]
    sampler_config = gen.engine.instance["sampler_config"]

    def request(steps: int) -> GenerationRequest:
        return GenerationRequest("a red fox jumps over a frozen river", negative_prompt="blurry", height=size.height,
                                 width=size.width, num_frames=size.num_frames, num_inference_steps=steps, seed=0)

    driver = _inputs(gen, request(args.driver_steps))
    d_bare, d_engine = _alternate(5, lambda: bare_loop(_noop, driver, sampler_config),
                                  lambda: engine_loop(_noop, driver, gen))
    per_step_us = (statistics.median(d_engine) - statistics.median(d_bare)) / args.driver_steps * 1e6

    real = _inputs(gen, request(args.steps))
    same = torch.equal(bare_loop(transformer, real, sampler_config), engine_loop(transformer, real, gen))
    e_bare, e_engine = _alternate(args.runs, lambda: bare_loop(transformer, real, sampler_config),
                                  lambda: engine_loop(transformer, real, gen))
    step_s = statistics.median(e_bare) / args.steps
    result = {
        "size": args.size,
        "driver": {"steps": args.driver_steps, "bare_s": d_bare, "engine_s": d_engine,
                   "overhead_per_step_us": round(per_step_us, 1)},
        "end_to_end": {"steps": args.steps, "bare_s": e_bare, "engine_s": e_engine,
                       "overhead_pct": round(100 * (statistics.median(e_engine) / statistics.median(e_bare) - 1), 2)},
        "identical_latents": same,
        "mid_step_s": round(step_s, 4),
        "driver_overhead_pct_of_step": round(100 * per_step_us * 1e-6 / step_s, 4),
        "target_pct": 2.0,
        "environment": environment(),
    }
    print_table(
        ["measure", "bare", "engine", "overhead"],
        [
            ["driver per step (no-op net)", f"{statistics.median(d_bare) / args.driver_steps * 1e6:.0f} us",
             f"{statistics.median(d_engine) / args.driver_steps * 1e6:.0f} us", f"{per_step_us:.0f} us"],
            [f"end to end, {args.steps} steps (median)", f"{statistics.median(e_bare):.2f} s",
             f"{statistics.median(e_engine):.2f} s", f"{result['end_to_end']['overhead_pct']:+.2f}%"],
            ["driver overhead / step time", "", f"{step_s:.3f} s/step", f"{result['driver_overhead_pct_of_step']:.4f}%"],
        ],
    )
    print(f"identical latents: {same}; target < {result['target_pct']}% of step time")
    write_json(f"overhead-{args.size}.json", result)


if __name__ == "__main__":
    main()
