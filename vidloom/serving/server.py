"""`vidloom serve`: load the model, bind the socket, run uvicorn."""

from __future__ import annotations

import logging
import socket
from typing import Awaitable, Callable

import uvicorn

from vidloom.serving.config import ServeConfig
from vidloom.serving.http_protocol import ConnectionLimits, protocol_class

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so port 0 works and the real port can be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class BindError(OSError):
    """The address is taken, not ours, or not resolvable; the message says which address."""


class GracefulServer(uvicorn.Server):
    """uvicorn, with one step added to its shutdown: after the listeners close, `drain` ends the jobs.

    uvicorn alone waits for every open connection (an event stream never ends by itself), then cuts
    them; draining first makes each stream send its job's final event and close, so nothing waits.
    """

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting first (uvicorn's own shutdown repeats this, harmlessly)
            server.close()
        for sock in sockets or []:
            sock.close()
        if not self.force_exit:  # a second Ctrl-C skips the grace period
            try:
                await self._drain()
            except Exception:
                log.exception("draining jobs at shutdown failed")
        await super().shutdown(sockets)


def connection_limits(config: ServeConfig, health_sock: socket.socket | None = None) -> ConnectionLimits:
    """The protocol's limits; `health_sock`: the bound probe-only listener, whose real port the protocol needs."""
    return ConnectionLimits(
        header_timeout_s=config.header_timeout_s, max_connections=config.max_connections,
        probe_connections=config.probe_connections,
        health_port=None if health_sock is None else health_sock.getsockname()[1],
    )


def uvicorn_server(app: object, config: ServeConfig, log_level: str = "info",
                   health_sock: socket.socket | None = None) -> uvicorn.Server:
    """uvicorn for `app`; pass every socket (the API's, then `health_sock` if any) to its run()."""
    from vidloom.serving.app import drain

    settings = uvicorn_config(app, config, log_level, health_sock)
    return GracefulServer(settings, drain=lambda: drain(app))  # type: ignore[arg-type]


def uvicorn_config(app: object, config: ServeConfig, log_level: str = "info",
                   health_sock: socket.socket | None = None) -> uvicorn.Config:
    """uvicorn's settings for a vidloom listener (the single server's, and the fleet ingress's)."""
    return uvicorn.Config(
        app, log_level=log_level, timeout_graceful_shutdown=config.graceful_shutdown_s,
        # One process: the model is resident once and the device worker is a thread in it.
        workers=1, lifespan="on",
        # Slow or idle clients: a deadline for each request head, the keep-alive idle timeout, and a
        # cap on connections that keeps /health answerable (our h11 protocol: http_protocol.py).
        http=protocol_class(connection_limits(config, health_sock)),
        timeout_keep_alive=config.keep_alive_timeout_s,  # type: ignore[arg-type]  # uvicorn takes a float
        limit_concurrency=None,  # the protocol's cap replaces uvicorn's, which would refuse /health too
    )


def bind_health(config: ServeConfig) -> socket.socket | None:
    """The probe-only listener (--health-port) on the API's host, or None."""
    return None if config.health_port is None else bind(config.host, config.health_port)


def serve(config: ServeConfig, on_listening: Callable[[], None] | None = None) -> None:
    """Blocks until SIGINT/SIGTERM, then drains (see ServeConfig.graceful_shutdown_s). `on_listening` is called
    once the address is printed (the CLI tells a Ctrl-C that stops the server from one that cuts a start short).

    Raises BindError or StoreError (a corrupt database, a full disk, a -wal without its database) before
    the address is printed.
    """
    from vidloom.generator import VideoGenerator
    from vidloom.serving.app import create_app
    from vidloom.serving.jobs import open_store

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sock = bind(config.host, config.port)  # first, so a taken port fails before a long model load
    try:
        health_sock = bind_health(config)
    except BindError:
        sock.close()
        raise
    try:
        store = open_store(config)  # and a bad database too
    except BaseException:
        sock.close()
        if health_sock is not None:
            health_sock.close()
        raise
    from vidloom.lora.registry import DEFAULT_MAX_LORAS

    lora_files = config.lora_files
    max_loras = config.max_loras
    if max_loras is None and lora_files:
        max_loras = max(DEFAULT_MAX_LORAS, len(lora_files))
    if config.fuse_loras:  # added into the weights at load: no run-time registry bound to set
        fused = {name: (path, scale) for name, path, scale in config.lora_entries}
        generator = VideoGenerator.from_pretrained(config.model, device=config.device, dtype=config.dtype,
                                                   deploy=config.deploy, fuse_loras=fused)
    else:
        generator = VideoGenerator.from_pretrained(
            config.model, device=config.device, dtype=config.dtype, deploy=config.deploy, max_loras=max_loras,
        )
        for name, path in lora_files:
            generator.load_lora(name, path)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    _warn_if_open(config, host)
    print(f"vidloom serving {config.served_model_name or generator.card.model_id} on http://{shown}:{port} "
          f"(data in {config.data_dir.resolve()})", flush=True)
    if health_sock is not None:
        print(f"health and metrics also on http://{shown}:{health_sock.getsockname()[1]}", flush=True)
    sockets = [sock] if health_sock is None else [sock, health_sock]
    if on_listening is not None:
        on_listening()
    uvicorn_server(create_app(generator.engine, config, store), config, health_sock=health_sock).run(sockets=sockets)


def _warn_if_open(config: ServeConfig, host: str) -> None:
    if not config.all_keys and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s without an API key: anyone who can reach it can use it "
                    "(set VIDLOOM_API_KEY, --api-key or --api-keys-file)", host)
