"""Program: ordered nodes that read and write named slots; checked when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from vidloom.core.loop import Loop
from vidloom.core.request import GenerationRequest


class NodeContext(Protocol):
    """What a component node may ask of the runtime."""

    def progress(self, phase: str, done: int, total: int) -> None: ...


NodeFn = Callable[[Mapping[str, Any], NodeContext], Mapping[str, Any]]


@dataclass(frozen=True)
class Node:
    """One stage: a component call (`run`) or a loop (`loop`) the runtime drives."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    run: NodeFn | None = None
    loop: Loop[Any] | None = None
    when: Callable[[GenerationRequest], bool] | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.loop is None):
            raise ValueError(f"node {self.name!r}: give exactly one of run= or loop=")

    def applies(self, request: GenerationRequest) -> bool:
        return self.when is None or self.when(request)


class ProgramError(ValueError):
    """A program whose nodes read slots nothing provides."""


@dataclass(frozen=True)
class Program:
    """Ordered nodes over named slots; `inputs` are slots the request supplies.

    `chat_loop`, when set, answers chat requests: the runtime runs it as a program of its own (a
    ChatPrompt in slot `chat`, a ChatResult out as `completion`), scheduled beside generation requests.
    `paged_networks`: other AR networks whose decode steps run on paged KV (a speech model's talker); each gets
    a pool of its own layout beside the chat loop's (LoopContext.reserve_kv's `network`).
    `chat_inputs`: the message part kinds the chat loop reads (text, image, audio); `voices`: the voices its speech
    nodes speak in, the first the default (clients such as the playground list them).
    """

    nodes: tuple[Node, ...]
    inputs: frozenset[str]
    outputs: tuple[str, ...]
    chat_loop: Loop[Any] | None = None
    paged_networks: tuple[Any, ...] = ()
    chat_inputs: frozenset[str] = frozenset({"text"})
    voices: tuple[str, ...] = ()
    check: Callable[[GenerationRequest], None] | None = None

    def __post_init__(self) -> None:
        available = set(self.inputs)
        names: set[str] = set()
        for node in self.nodes:
            if node.name in names:
                raise ProgramError(f"duplicate node name {node.name!r}")
            names.add(node.name)
            missing = [slot for slot in node.reads if slot not in available]
            if missing:
                raise ProgramError(
                    f"node {node.name!r} reads {missing} but no earlier node writes them "
                    f"and the request does not supply them"
                )
            available.update(node.writes)
        missing_out = [slot for slot in self.outputs if slot not in available]
        if missing_out:
            raise ProgramError(f"program outputs {missing_out} are never written")

    def active_nodes(self, request: GenerationRequest) -> list[Node]:
        """Nodes that run for this request, in order."""
        return [node for node in self.nodes if node.applies(request)]
