"""`vidloom fleet up --config fleet.yaml`: start (or join) Ray, deploy the fleet, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vidloom.fleet.config import FleetCard


def add_fleet_parser(sub: argparse._SubParsersAction) -> None:
    fleet = sub.add_parser("fleet", help="run a fleet of model replicas on Ray Serve")
    actions = fleet.add_subparsers(dest="fleet_command", required=True)
    up = actions.add_parser("up", help="deploy the fleet and serve until stopped")
    up.add_argument("--config", required=True, metavar="FLEET.yaml", help="deployment card with a fleet: section")
    up.add_argument("--print-config", action="store_true", help="print the effective fleet card and exit")


def run_fleet(args: argparse.Namespace) -> int:
    from vidloom.fleet.config import load_fleet_card
    from vidloom.serving.deploy_card import DeployCardError, dump_card

    try:
        card = load_fleet_card(Path(args.config))
    except DeployCardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_card(card.base, "# vidloom fleet card (effective settings)\n"), end="")
        print(dump_card_section("fleet", card.fleet), end="")
        return 0
    stop = _stop_on_signals()
    url = start_fleet(card)
    print(f"vidloom fleet serving {', '.join(m.model for m in card.fleet.models)} on {url}", flush=True)
    stop.wait()
    from ray import serve

    serve.shutdown()  # replicas drain: running jobs get graceful_shutdown_s, then fail (server_restart)
    return 0


def start_fleet(card: FleetCard) -> str:
    """Start or join Ray, start Serve's HTTP proxy on the card's address, deploy; returns the base URL."""
    import ray
    from ray import serve

    from vidloom.fleet.ray_app import fleet_application

    fleet, base = card.fleet, card.base
    if not ray.is_initialized():
        if fleet.ray_address:
            ray.init(address=fleet.ray_address)
        else:
            ray.init(num_cpus=fleet.num_cpus, object_store_memory=fleet.object_store_mb * 2**20,
                     include_dashboard=False)
    serve.start(http_options={"host": base.host, "port": base.port})
    serve.run(fleet_application(card), name=fleet.app_name, route_prefix="/")
    return f"http://{base.host}:{base.port}"


def dump_card_section(name: str, config: object) -> str:
    import yaml

    from vidloom.serving.deploy_card import card_values

    return yaml.safe_dump({name: card_values(config)}, sort_keys=False)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
