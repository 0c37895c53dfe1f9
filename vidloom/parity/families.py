"""Every family's parity maps (each declared in its folder, Family.parity), merged into the lookup tables.

Keyed by the diffusers pipeline class a checkpoint folder names (model_index.json), since that pipeline is the
reference for the folder. Our tap names are the canonical ones: the reference's block lists and forward
arguments are recorded under them. The tables are built on first use (a family's parity module imports this
package, so building them at import would be a cycle).
"""

from __future__ import annotations

import functools
from typing import Any

from vidloom import registry
from vidloom.core.family import Family
from vidloom.parity.family import ParityMaps

TABLES = {
    "FAMILIES": "pipelines",  # pipeline class -> its FamilyParity
    "VIDEO_TO_VIDEO": "video_to_video",  # a folder's pipeline -> the one diffusers runs video-to-video with
    "IMAGE_TO_VIDEO": "image_to_video",  # a folder's pipeline -> the one it runs image-to-video with
    "TWO_STAGE": "two_stage",  # a folder's pipeline -> the FamilyParity of its two-stage chain
    "SEQUENCE_FAMILIES": "sequences",  # a transformers architecture (config.json) -> its SequenceParity
}


def __getattr__(name: str) -> Any:
    if name in TABLES:
        return merged(TABLES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def merged(field: str) -> dict[str, Any]:
    """ParityMaps.`field` of every family, as one table (ValueError on a key two families declare)."""
    return _merged(registry.families(), field)


@functools.cache
def _merged(families: tuple[Family, ...], field: str) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for family in families:
        if family.parity is None:
            continue
        maps: ParityMaps = family.resolve(family.parity)
        entries = getattr(maps, field)
        if field == "pipelines":
            entries = {spec.pipeline: spec for spec in entries}
        elif field == "sequences":
            entries = {spec.architecture: spec for spec in entries}
        for key, value in entries.items():
            if key in table:
                raise ValueError(f"parity map {field}[{key!r}] is declared twice (again by family {family.name!r})")
            table[key] = value
    return table
