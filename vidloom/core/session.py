"""VideoSession: what a finished causal video leaves behind so a later request can extend it.

A causal rollout (AnyFlow-FAR) ends with the whole video's latents; an extension continues
the rollout after them under a new prompt. The session carries the latents and how they
were made (chunk partition, text conditioning), which is everything needed to rebuild the
KV cache the extension attends to when the runtime no longer holds it resident. The
session id names the resident KV in the runtime's cache manager (the source's request id;
on the server, its video id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vidloom.core.errors import InvalidRequest

from vidloom.core.blocks import EXTEND_FROM  # noqa: F401 (its old home, still read from here)

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest



@dataclass(frozen=True)
class VideoSession:
    """A finished causal video as an extension source."""

    session_id: str
    model: str  # the checkpoint the latents belong to (ModelCard.source, else its model id)
    latents: Tensor = field(compare=False, repr=False)  # [1, C, F, h, w] normalised latents, float32 on CPU
    partition: tuple[int, ...]  # latent frames per chunk; an extension appends chunks after these
    prompt: str
    negative_prompt: str
    guidance_scale: float  # the source's text conditioning (uncond, cond) shapes the KV it leaves
    height: int
    width: int
    num_frames: int
    fps: int

    @property
    def uses_cfg(self) -> bool:
        return self.guidance_scale > 1.0

    def save(self, path: Path) -> None:
        """Write as safetensors (latents) with the rest as JSON metadata; no pickle."""
        from safetensors.torch import save_file

        meta = {name: getattr(self, name) for name in _META}
        save_file({"latents": self.latents.contiguous()}, str(path), metadata={"session": json.dumps(meta)})

    @classmethod
    def load(cls, path: Path) -> VideoSession:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["session"])
            latents = f.get_tensor("latents")
        meta["partition"] = tuple(meta["partition"])
        return cls(latents=latents, **meta)


_META = ("session_id", "model", "partition", "prompt", "negative_prompt", "guidance_scale", "height", "width",
         "num_frames", "fps")


def model_key(card: ModelCard) -> str:
    """What a session records as its model: the checkpoint path when the card has one (a served name may differ)."""
    return card.source or card.model_id


def latents_to_cpu(latents: Tensor) -> Tensor:
    return latents.detach().to("cpu", torch.float32).contiguous()


def extension_fields(request: GenerationRequest, card: ModelCard, kind: str) -> dict[str, object]:
    """An extension's source session (its extend_from option, a `kind` video's output or session, of this card's
    model) and the fields it fixes (task, size, frame rate), checked against the request's; {} if none."""
    from vidloom.core.request import Task

    source = request.option(EXTEND_FROM)
    if source is None:
        return {}
    session = getattr(source, "session", source)  # a VideoOutput carries its session
    if not isinstance(session, VideoSession):
        hint = " (the model keeps none for it)" if hasattr(source, "frames") else ""
        raise InvalidRequest(EXTEND_FROM, f"must be a finished {kind} video's output or its VideoSession{hint}, "
                                          f"got {type(source).__name__}")
    if session.model != model_key(card):
        raise InvalidRequest(EXTEND_FROM, f"the source video was made by another model ({session.model}); this is "
                                          f"{card.model_id}")
    for name in ("image", "video"):
        if getattr(request, name) is not None:
            raise InvalidRequest(name, "cannot be combined with extend_from (the source video is the context)")
    fields: dict[str, object] = {EXTEND_FROM: session, "task": Task.V2V}
    for name in ("height", "width", "fps"):
        given = getattr(request, name)
        if given is not None and given != getattr(session, name):
            raise InvalidRequest(name, f"is {given} but the source video's is {getattr(session, name)}; an extension "
                                       "keeps the source's size and frame rate")
        fields[name] = getattr(session, name)
    return fields
