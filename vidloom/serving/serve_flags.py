"""`vidloom serve`'s flags as a card layer, merged over a deployment card into the effective ServeConfig.

Precedence, lowest first: the dataclass defaults, the card (`--config`), $VIDLOOM_API_KEY, the flags
the user typed. Only typed flags override: argparse defaults never hide a card's value.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable

from vidloom.core.parallel import ParallelPlan
from vidloom.serving.api_keys import API_KEY_ENV
from vidloom.serving.config import ServeConfig
from vidloom.serving.deploy_card import CardLayer, build, load_card, merge

# Flags that are not settings: where to read the card, what to do with it.
NOT_SETTINGS = ("config", "print_config", "command", "verbose")
# Sections of a card that `vidloom serve` does not read (a fleet card's extra sections).
OTHER_SECTIONS = ("fleet",)

_Convert = Callable[[Any], Any]
# flag dest -> (card key path, conversion of the flag's value to the card's)
FLAG_KEYS: dict[str, tuple[tuple[str, ...], _Convert]] = {
    "max_request_memory_gb": (("max_request_memory_bytes",), lambda gb: None if gb is None else int(gb * 2**30)),
    "header_timeout": (("header_timeout_s",), float),
    "keep_alive_timeout": (("keep_alive_timeout_s",), float),
    "shutdown_grace": (("graceful_shutdown_s",), float),
    "allowed_host": (("allowed_hosts",), list),
    "cors_origin": (("cors_origins",), list),
    "data_dir": (("data_dir",), str),
    "lora": (("loras",), list),
    "lora_dir": (("lora_dirs",), list),
    "max_lora_mb": (("max_lora_file_bytes",), lambda mb: max(1, int(mb * 2**20))),
    "model_arg": (("model",), str),  # `vidloom serve MODEL`, the same setting as --model
    "batch_wait_ms": (("batch_wait_s",), lambda ms: float(ms) / 1000.0),
    "max_body_mb": (("max_body_bytes",), lambda mb: max(1, int(mb * 2**20))),
    # cli/deploy_args.py's flags
    "fp8": (("deploy", "fp8_weights"), bool),
    "warmup": (("deploy", "warmup_shapes"), lambda shapes: [list(s) for s in shapes]),
    "prompt_cache": (("deploy", "prompt_cache_size"), int),
    "kv_cache_budget_mb": (("deploy", "kv_cache_budget_bytes"), lambda mb: None if mb is None else max(1, int(mb * 2**20))),
    "kv_session_ttl": (("deploy", "kv_session_ttl_s"), float),
    "sp": (("deploy", "parallel", "sp"), int),
    "cfg_parallel": (("deploy", "parallel", "cfg"), lambda degree: int(degree) if degree else 1),
    "shard_weights": (("deploy", "parallel", "shard_weights"), bool),
    "text_encoder_rank": (("deploy", "parallel", "text_encoder_rank"), lambda rank: None if rank is None else int(rank)),
    "component": (("deploy", "components"), dict),  # NAME=FILE pairs, written as the card's mapping
}
_DEPLOY_SAME = ("compile", "cuda_graphs", "compile_backend", "offload_text_encoder", "vae_tile", "vae_tile_stride",
                "offload_idle_expert", "kv_pool_tokens",
                "attention_backend",
                "cfg_mode", "step_cache", "step_cache_threshold", "step_cache_fn", "step_cache_bn", "step_cache_warmup",
                "step_cache_max_cached", "step_cache_max_continuous", "step_cache_taylorseer", "step_cache_mask", "two_stage", "upsampler", "stage2_lora", "devices")


def flag_key(dest: str) -> tuple[tuple[str, ...], _Convert]:
    """Where flag `dest` lands in the card; flags named like a ServeConfig field land on that field."""
    if dest in FLAG_KEYS:
        return FLAG_KEYS[dest]
    if dest in _DEPLOY_SAME:
        return ("deploy", dest), _same
    return (dest,), _same


def _same(value: Any) -> Any:
    return value


def typed_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests the user typed in `argv` (parsed again with every default suppressed)."""
    serve = _serve_subparser(parser)
    saved = [(action, action.default) for action in serve._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        typed = vars(parser.parse_args(argv))
    finally:
        for action, default in saved:
            action.default = default
    return set(typed) - set(NOT_SETTINGS)


def _serve_subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise LookupError("the parser has no serve command")


def flag_layer(args: argparse.Namespace, typed: set[str]) -> CardLayer:
    """The typed flags (and $VIDLOOM_API_KEY unless --api-key was typed) as a card layer."""
    values: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    env_key = os.environ.get(API_KEY_ENV)
    if "api_key" not in typed and env_key:
        values["api_key"] = env_key
        origins[("api_key",)] = f"${API_KEY_ENV}"
    for dest in sorted(typed):
        path, convert = flag_key(dest)
        node = values
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = convert(getattr(args, dest))
        origins[path] = "--" + dest.replace("_", "-")
    return CardLayer(values, origins)


def effective_config(args: argparse.Namespace, typed: set[str], launched_world: int | None = None) -> ServeConfig:
    """Defaults < card < environment < typed flags, validated (raises DeployCardError naming the source)."""
    card = load_card(Path(args.config)) if getattr(args, "config", None) else CardLayer({}, {}, "defaults")
    layer = merge(card, flag_layer(args, typed))
    deploy = layer.values.get("deploy")
    if isinstance(deploy, dict) and "devices" not in deploy:
        layer.values["deploy"] = dict(deploy, devices=_default_devices(deploy, launched_world))
    elif deploy is None and launched_world:
        layer.values["deploy"] = {"devices": launched_world}
    return build(ServeConfig, layer, ignore=OTHER_SECTIONS)


def _default_devices(deploy: dict[str, Any], launched_world: int | None) -> Any:
    """--devices' default: the processes a launcher started, else what the parallel plan needs."""
    if launched_world:
        return launched_world
    plan = deploy.get("parallel")
    if not isinstance(plan, dict):
        return 1
    sp, cfg = plan.get("sp", 1), plan.get("cfg", 1)
    try:
        return ParallelPlan(sp=sp, cfg=cfg).world_size
    except (ValueError, TypeError):
        return 1  # the plan's own error is raised, with its line, when the card is built

