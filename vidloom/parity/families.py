"""Every family's parity maps (each declared in its folder, Family.parity), merged into the lookup tables.

Keyed by the diffusers pipeline class a checkpoint folder names (model_index.json), since that pipeline is the
reference for the folder. Our tap names are the canonical ones: the reference's block lists and forward
arguments are recorded under them.
"""

from __future__ import annotations

from vidloom import registry
from vidloom.parity.family import FamilyParity, ParityMaps, SequenceParity


def _merged(name: str) -> dict:
    tables: dict = {}
    for family in registry.families():
        if family.parity is None:
            continue
        maps: ParityMaps = family.resolve(family.parity)
        table = getattr(maps, name)
        entries = {spec.pipeline if name == "pipelines" else spec.architecture: spec for spec in table} \
            if isinstance(table, tuple) else dict(table)
        for key, value in entries.items():
            if key in tables:
                raise ValueError(f"parity map {name}[{key!r}] is declared twice (again by family {family.name!r})")
            tables[key] = value
    return tables


FAMILIES: dict[str, FamilyParity] = _merged("pipelines")
"""Pipeline class -> its parity map."""
VIDEO_TO_VIDEO: dict[str, str] = _merged("video_to_video")
"""A folder's pipeline -> the one diffusers runs video-to-video with on the same folder."""
IMAGE_TO_VIDEO: dict[str, str] = _merged("image_to_video")
"""A folder's pipeline -> the one diffusers runs image-to-video with on the same folder's components."""
TWO_STAGE: dict[str, FamilyParity] = _merged("two_stage")
"""A folder's pipeline -> the map of its two-stage chain (our DeployConfig two_stage), by the same pipeline class."""
SEQUENCE_FAMILIES: dict[str, SequenceParity] = _merged("sequences")
"""A transformers checkpoint's architecture (config.json) -> its autoregressive parity map."""
