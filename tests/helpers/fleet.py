"""The fleet's ingress over in-process replicas: the real FleetServer (our uvicorn, the single server's limits)
and real ReplicaCores (JobManagers on their own loops) on a PostgreSQL store; only Ray's handle is stood in for."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Mapping

from vidloom.fleet.replica import ReplicaCore
from vidloom.fleet.server import FleetServer
from vidloom.runtime.engine import Engine
from vidloom.serving.config import ServeConfig


class LocalStream:
    """What `handle.options(stream=True).http.remote(...)` returns: async messages, and cancel()."""

    def __init__(self, messages: AsyncIterator[dict[str, Any]]) -> None:
        self._messages = messages

    def __aiter__(self) -> "LocalStream":
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._messages.__anext__()

    def cancel(self) -> None:
        async def close() -> None:
            await asyncio.sleep(0)  # let a cancelled reader's CancelledError reach the generator first
            with contextlib.suppress(RuntimeError):
                await self._messages.aclose()  # type: ignore[attr-defined]

        asyncio.get_running_loop().create_task(close())


class LocalReplicas:
    """A Ray Serve DeploymentHandle's calling convention over in-process replicas (taken in turn)."""

    def __init__(self, cores: list[ReplicaCore]) -> None:
        self.cores = cores
        self._turn = 0

    def options(self, **_: Any) -> "LocalReplicas":
        return self

    @property
    def http(self) -> "LocalReplicas":
        return self

    def remote(self, request: dict[str, Any]) -> LocalStream:
        core = self.cores[self._turn % len(self.cores)]
        self._turn += 1
        return LocalStream(core.http(request))


class LocalFleet:
    """`engines`: one replica per model; `config`: the card's settings (store must be PostgreSQL, port 0)."""

    def __init__(self, engines: list[Engine], config: ServeConfig) -> None:
        from vidloom.serving.jobs import open_store

        self.cores = [ReplicaCore(engine, config, open_store(config), name=f"local#{i}")
                      for i, engine in enumerate(engines)]
        self.models: Mapping[str, LocalReplicas] = {c.jobs.card.model_id: LocalReplicas([c]) for c in self.cores}
        self.server = FleetServer(config)
        self.server.start(self.models, log_level="warning")
        self.url, self.health_url = self.server.url, self.server.health_url

    def stop(self) -> None:
        self.server.stop()
        for core in self.cores:
            core.close()
