"""Deployment cards: every config field is a key, every error names file, line and key, typed flags win."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from vidloom.cli import build_parser, main
from vidloom.core.deploy import DeployConfig
from vidloom.serving.config import ServeConfig
from vidloom.serving.deploy_card import (
    DeployCardError, build, card_keys, card_values, dump_card, load_card, parse_card,
)
from vidloom.serving.api_keys import ApiKey
from vidloom.serving.serve_flags import NOT_SETTINGS, _serve_subparser, effective_config, flag_key, typed_flags

# Non-default values per field that a valid config accepts together (anything not here is derived from its type).
_CHOSEN = {"policy": "interleave", "compile_backend": "aot_eager", "cfg_mode": "batched", "step_cache": "balanced",
           "step_cache_taylorseer": 2, "step_cache_mask": "static:1101",
           "vae_tile": 256, "vae_tile_stride": 192, "dtype": "bfloat16", "device": "cpu", "port": 8123,
           "allowed_hosts": ("example.com",), "cors_origins": ("https://app.example.com",),
           "warmup_shapes": ((32, 48, 5),), "model": "/models/wan-1.3b",
           "store": "postgresql://vidloom@db.internal/jobs", "lost_jobs": "requeue",
           "lora_dirs": (Path("/loras"),), "api_keys": (ApiKey("sk-card-user", "user", "alice"),),
           "api_keys_file": Path(__file__).with_name("sample_keys.txt"),
           "kv_pool_tokens": 4096, "cuda_graphs": False, "loras": ("style=/loras/style.safetensors",),
           "components": (("transformer", "/models/wan2.1_t2v_1.3B.safetensors"), ("vae", "/models/wan_vae.gguf"))}  # offload_idle_expert (flipped on) refuses cuda_graphs


def _sample(name: str, hint: Any, default: Any) -> Any:
    """A value for field `name` different from its default, chosen from its annotation alone."""
    if name in _CHOSEN:
        return _CHOSEN[name]
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if dataclasses.is_dataclass(hint):
        return default
    if hint is bool:
        return not default
    if hint in (int, float):
        return hint((default or 1) * 3)
    if hint is str:
        return f"{default}-x"
    if hint is Path:
        return Path("elsewhere")
    raise AssertionError(f"{name}: add a sample value for {hint!r}")


def _every_field_changed() -> ServeConfig:
    changed = {}
    for name, hint in card_keys(ServeConfig).items():
        if name != "deploy":
            changed[name] = _sample(name, hint, getattr(ServeConfig(), name))
    deploy = {name: _sample(name, hint, getattr(DeployConfig(), name))
              for name, hint in card_keys(DeployConfig).items() if name not in ("devices", "parallel")}
    return ServeConfig(**changed, deploy=DeployConfig(**deploy))


def test_every_field_round_trips_through_a_printed_card(tmp_path: Path):
    config = _every_field_changed()
    assert all(getattr(config, n) != getattr(ServeConfig(), n) for n in card_keys(ServeConfig) if n != "deploy")
    path = tmp_path / "card.yaml"
    path.write_text(dump_card(config))
    again = build(ServeConfig, load_card(path))
    assert dataclasses.replace(again, api_key=config.api_key, api_keys=config.api_keys) == config  # keys: never printed
    assert "api_key" not in card_values(config) and "# api_key: set" in dump_card(config)
    assert "sk-card-user" not in dump_card(config) and "# api_keys: set" in dump_card(config)


def test_a_store_password_is_never_printed():
    config = ServeConfig(store="postgresql://vidloom:s3cret@db/jobs")
    assert "s3cret" not in dump_card(config) and "postgresql://vidloom:***@db/jobs" in dump_card(config)


def test_a_new_config_field_is_a_card_key_without_code_changes():
    @dataclasses.dataclass(frozen=True)
    class Grown(ServeConfig):
        brand_new_limit: int = 3

    layer = parse_card("brand_new_limit: 7\nslots: 2\n", "grown.yaml")
    grown = build(Grown, layer)
    assert grown.brand_new_limit == 7 and grown.slots == 2
    with pytest.raises(DeployCardError, match=r"grown.yaml:1: brand_new_limit: expected an integer"):
        build(Grown, parse_card("brand_new_limit: lots\n", "grown.yaml"))


@pytest.mark.parametrize(("text", "message"), [
    ("slots: 2\nslotz: 3\n", r"card.yaml:2: slotz: unknown key \(did you mean 'slots'\?\)"),
    ("deploy:\n  zzz: 1\n", r"card.yaml:2: deploy.zzz: unknown key; known: fp8_weights, "),
    ("slots: two\n", r"card.yaml:1: slots: expected an integer, got str 'two'"),
    ("slots: true\n", r"card.yaml:1: slots: expected an integer, got bool"),
    ("enable_docs: 1\n", r"card.yaml:1: enable_docs: expected true or false"),
    ("data_dir: 5\n", r"card.yaml:1: data_dir: expected a path"),
    ("allowed_hosts: example.com\n", r"card.yaml:1: allowed_hosts: expected a list"),
    ("deploy:\n  warmup_shapes: [32x48]\n", r"card.yaml:2: deploy.warmup_shapes.0: expected a list of 3 values or 'HxWxF'"),
    ("deploy: fast\n", r"card.yaml:1: deploy: expected a mapping of DeployConfig settings"),
    ("deploy:\n  devices: 2\n  parallel:\n    sp: 3\n",
     r"card.yaml:2: deploy.devices: devices \(--devices\) is 2 but the parallel plan sp=3 x cfg=1"),
    ("deploy:\n  parallel:\n    cfg: 5\n", r"card.yaml:3: deploy.parallel.cfg: parallel.cfg must be 1 to 4"),
    ("deploy:\n  parallel:\n    sp: 0\n", r"card.yaml:3: deploy.parallel.sp: parallel.sp \(--sp\) must be"),
    ("deploy:\n  parallel:\n    tp: 2\n", r"card.yaml:3: deploy.parallel.tp: unknown key"),
    ("\n\npolicy: lifo\n", r"card.yaml:3: policy: policy: unknown 'lifo'"),
    ("port: 99999\n", r"card.yaml:1: port: port: must be in 0..65535"),
    ("slots: 1\nslots: 2\n", r"card.yaml:2: slots is set twice"),
    ("- slots\n", r"card.yaml:1: a deployment card is a mapping"),
    ("slots: [1\n", r"card.yaml:2: not valid YAML"),
    ("1: 2\n", r"card.yaml:1: keys are setting names"),
])
def test_errors_name_the_file_line_and_key(text: str, message: str):
    with pytest.raises(DeployCardError, match=message):
        build(ServeConfig, parse_card(text, "card.yaml"))


def test_an_unreadable_card_names_the_file(tmp_path: Path):
    with pytest.raises(DeployCardError, match=r"missing.yaml: cannot read it"):
        load_card(tmp_path / "missing.yaml")


def _effective(argv: list[str]) -> ServeConfig:
    parser = build_parser()
    return effective_config(parser.parse_args(argv), typed_flags(parser, argv))


def test_typed_flags_override_the_card_and_defaults_do_not(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    card = tmp_path / "deploy.yaml"
    card.write_text("slots: 4\nqueue_size: 9\nheader_timeout_s: 3\ndeploy:\n  cfg_mode: batched\n"
                    "  parallel: {sp: 1}\n  prompt_cache_size: 5\n")
    plain = _effective(["serve", "--config", str(card)])
    assert (plain.slots, plain.queue_size, plain.header_timeout_s) == (4, 9, 3.0)
    assert plain.deploy.cfg_mode == "batched" and plain.deploy.prompt_cache_size == 5
    over = _effective(["serve", "--config", str(card), "--slots", "1", "--header-timeout", "7",
                       "--cfg-mode", "sequential", "--prompt-cache", "0", "--max-request-memory-gb", "0.5"])
    assert (over.slots, over.queue_size, over.header_timeout_s) == (1, 9, 7.0)
    assert over.deploy.cfg_mode == "sequential" and over.deploy.prompt_cache_size == 0
    assert over.max_request_memory_bytes == 2**29


def test_without_a_card_the_flags_give_the_same_config_as_before(monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    assert _effective(["serve"]) == ServeConfig()
    config = _effective(["serve", "--sp", "2", "--cfg-parallel", "--allowed-host", "a.example", "--fp8"])
    assert config.deploy.devices == 4 and config.deploy.parallel.sp == 2 and config.deploy.parallel.cfg == 2
    assert config.allowed_hosts == ("a.example",) and config.deploy.fp8_weights


def test_the_api_key_comes_from_env_over_the_card_and_the_flag_over_both(tmp_path: Path, monkeypatch):
    card = tmp_path / "deploy.yaml"
    card.write_text("api_key: from-card\n")
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    assert _effective(["serve", "--config", str(card)]).api_key == "from-card"
    monkeypatch.setenv("VIDLOOM_API_KEY", "from-env")
    assert _effective(["serve", "--config", str(card)]).api_key == "from-env"
    assert _effective(["serve", "--config", str(card), "--api-key", "typed"]).api_key == "typed"


def test_a_bad_flag_value_names_the_flag():
    with pytest.raises(DeployCardError, match=r"--sp: deploy.parallel.sp: parallel.sp \(--sp\) must be"):
        _effective(["serve", "--sp", "0"])


def test_every_serve_flag_lands_on_a_card_key():
    """A new flag must map to a config field, or cards and --print-config silently miss it."""
    serve = _serve_subparser(build_parser())
    for action in serve._actions:
        if action.dest in ("help", *NOT_SETTINGS):
            continue
        path, _ = flag_key(action.dest)
        cls: Any = ServeConfig
        for key in path[:-1]:
            cls = typing.get_type_hints(cls)[key]
        assert path[-1] in card_keys(cls), f"--{action.dest} maps to unknown card key {'.'.join(path)}"


def test_print_config_prints_a_card_that_loads_back(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    card = tmp_path / "deploy.yaml"
    card.write_text("slots: 3\ndeploy:\n  warmup_shapes: [32x48x5]\n")
    assert main(["serve", "--config", str(card), "--queue-size", "2", "--print-config"]) == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    config = build(ServeConfig, load_card(printed))
    assert config.slots == 3 and config.queue_size == 2 and config.deploy.warmup_shapes == ((32, 48, 5),)
    card.write_text("slots: 0\n")
    assert main(["serve", "--config", str(card), "--print-config"]) == 2
    assert f"{card}:1: slots: slots: must be >= 1" in capsys.readouterr().err


def test_health_port_and_probe_reserve_are_flags_and_card_keys(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    card = tmp_path / "deploy.yaml"
    card.write_text("health_port: 9100\nprobe_connections: 4\n")
    from_card = _effective(["serve", "--config", str(card)])
    assert (from_card.health_port, from_card.probe_connections) == (9100, 4)
    typed = _effective(["serve", "--config", str(card), "--health-port", "9200", "--probe-connections", "8"])
    assert (typed.health_port, typed.probe_connections) == (9200, 8)
    card.write_text("port: 9100\nhealth_port: 9100\n")
    with pytest.raises(DeployCardError, match="health_port: must differ from port"):
        _effective(["serve", "--config", str(card)])
