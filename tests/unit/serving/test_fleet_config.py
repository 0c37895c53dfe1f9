"""Fleet cards and the ingress's joined metrics (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidloom.fleet.config import load_fleet_card
from vidloom.fleet.ingress import merge_metrics
from vidloom.serving.deploy_card import DeployCardError

STORE = "store: postgresql://vidloom@db/jobs\n"


def _card(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_fleet_card_gives_each_model_its_replica_config(tmp_path: Path):
    card = load_fleet_card(_card(tmp_path, STORE + """slots: 2
deploy: {cfg_mode: batched}
fleet:
  models:
    - model: wan2.1-demo
      replicas: 3
    - model: /models/wan-14b
      num_gpus: 2
      slots: 1
      deploy: {devices: 2, parallel: {sp: 2}}
"""))
    small, big = card.fleet.models
    assert small.replicas == 3 and big.num_gpus == 2.0
    first, second = card.replica_config(small), card.replica_config(big)
    assert first.model == "wan2.1-demo" and first.slots == 2 and first.deploy.cfg_mode == "batched"
    assert second.slots == 1 and second.deploy.parallel.sp == 2 and second.store == card.base.store


@pytest.mark.parametrize(("text", "message"), [
    (STORE + "fleet:\n  models:\n    - model: a\n      replicaz: 2\n", r"fleet.yaml:5: fleet.models.0.replicaz: unknown key"),
    (STORE + "fleet:\n  models:\n    - model: a\n      replicas: 0\n", r"fleet.yaml:5: fleet.models.0.replicas: .*>= 1"),
    (STORE + "fleet:\n  models: []\n", r"fleet.yaml:3: fleet.models: .*at least one model"),
    (STORE + "fleet:\n  models:\n    - model: a\n    - model: a\n", r"fleet.yaml:3: fleet.models: models: each model once"),
    (STORE + "fleet:\n  models:\n    - model: a\n      deploy: {devices: 2}\n",
     r"fleet.yaml:5: fleet.models.0.deploy.devices: devices \(--devices\) is 2"),
    ("fleet:\n  models:\n    - model: a\n", r"fleet.yaml: store: a fleet's replicas share one job table"),
    (STORE + "slots: 1\n", r"needs a `fleet:` section"),
])
def test_fleet_card_errors_name_the_line_and_key(tmp_path: Path, text: str, message: str):
    with pytest.raises(DeployCardError, match=message):
        load_fleet_card(_card(tmp_path, text))


def test_metrics_of_every_replica_are_joined_with_a_replica_label():
    text = ("# HELP vidloom_queue_depth Requests waiting\n# TYPE vidloom_queue_depth gauge\nvidloom_queue_depth 2.0\n"
            '# HELP jobs_total Jobs\n# TYPE jobs_total counter\njobs_total{status="completed"} 5.0\n')
    merged = merge_metrics([("m#a", "wan", text), ("m#b", "wan", text.replace("2.0", "0.0"))], {"wan": None, "x": None})
    lines = merged.decode().splitlines()
    assert 'vidloom_fleet_replicas{model="wan"} 2' in lines and 'vidloom_fleet_replicas{model="x"} 0' in lines
    assert 'vidloom_queue_depth{replica="m#a"} 2.0' in lines and 'vidloom_queue_depth{replica="m#b"} 0.0' in lines
    assert 'jobs_total{status="completed",replica="m#b"} 5.0' in lines
    assert lines.count("# TYPE vidloom_queue_depth gauge") == 1


def test_fleet_up_print_config_prints_a_card_that_loads_back(tmp_path: Path, capsys):
    from vidloom.cli import main

    path = _card(tmp_path, STORE + "slots: 2\nfleet:\n  models:\n    - {model: wan2.1-demo, replicas: 2}\n")
    assert main(["fleet", "up", "--config", str(path), "--print-config"]) == 0
    printed = _card(tmp_path, capsys.readouterr().out)
    again = load_fleet_card(printed)
    assert again.base.slots == 2 and again.fleet.models[0].replicas == 2
    assert main(["fleet", "up", "--config", str(_card(tmp_path, "fleet:\n  models: []\n"))]) == 2
    assert "fleet.models" in capsys.readouterr().err
