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
    from vidloom.fleet.server import FleetServer


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
    try:
        server = start_fleet(card)
    except OSError as exc:  # serving.server.BindError: the address is taken or not ours
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"vidloom fleet serving {', '.join(m.model for m in card.fleet.models)} on {server.url}", flush=True)
    if server.health_url:
        print(f"health and metrics also on {server.health_url}", flush=True)
    try:
        stop.wait()
    finally:
        stop_fleet(server)
    return 0


def start_fleet(card: FleetCard, log_level: str = "info") -> FleetServer:
    """Bind the card's address, start or join Ray, deploy the replicas, serve the ingress (in a thread)."""
    from vidloom.fleet.ray_app import deploy_replicas, start_ray
    from vidloom.fleet.server import FleetServer

    server = FleetServer(card.base)  # first, so a taken port fails before Ray and the model loads
    try:
        start_ray(card)
        server.start(deploy_replicas(card), log_level=log_level)
    except BaseException:
        server.stop()
        raise
    return server


def stop_fleet(server: FleetServer) -> None:
    """Stop the ingress, then Serve: replicas drain (running jobs get graceful_shutdown_s, then fail)."""
    from ray import serve

    server.stop()
    serve.shutdown()


def dump_card_section(name: str, config: object) -> str:
    import yaml

    from vidloom.serving.deploy_card import card_values

    return yaml.safe_dump({name: card_values(config)}, sort_keys=False)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
