"""`vidloom models --capabilities`: the feature x checkpoint-kind matrix, read from what each family declares
(Family.capability_rows; the `lora` row from Family.lora), then why each kind refuses what it refuses.

The table is Markdown; the README's table under "Acceleration" is it, verbatim (tests/unit/test_cli_capabilities.py
fails when they differ).
"""

from __future__ import annotations

from typing import Mapping

from vidloom import registry
from vidloom.core import plugin
from vidloom.core.capabilities import FEATURES, Capabilities
from vidloom.core.family import Family

LORA_FLAGS = ("--lora", "loras")
"""The `lora` row: adapters per request (`--lora`, a request's `loras`), where the family declares a LoRA name map."""
NO_LORA = "its family declares no LoRA name map (Family.lora): adapters are refused naming the family"


def capability_rows() -> dict[str, Capabilities]:
    """Every checkpoint kind's declared capabilities, in registry order (labels are unique)."""
    return {label: caps for label, (caps, _) in _rows().items()}


def _rows() -> dict[str, tuple[Capabilities, Family]]:
    rows: dict[str, tuple[Capabilities, Family]] = {}
    for family in registry.families():
        if family.capability_rows is None:
            continue
        target = family.target(family.capability_rows)
        declared: Mapping[str, Capabilities] = plugin.resolve(target)
        for label, capabilities in declared.items():
            if label in rows:
                raise ValueError(f"{target}: capability row {label!r} is declared twice")
            rows[label] = (capabilities, family)
    return rows


def capability_table() -> str:
    """One line per feature (its flags), one column per checkpoint kind: `yes` where its card declares it."""
    rows = capability_rows()
    lines = [
        "| feature (flags) | " + " | ".join(rows) + " |",
        "| --- | " + " | ".join("---" for _ in rows) + " |",
    ]
    for name, feature in FEATURES.items():
        cells = ("yes" if name in caps.supported else "-" for caps in rows.values())
        flags = ", ".join(f"`{flag}`" for flag in feature.flags)
        lines.append(f"| `{name}` ({flags}) | " + " | ".join(cells) + " |")
    lora = ("yes" if _lora_refusal(caps, family) is None else "-" for caps, family in _rows().values())
    lines.append(f"| `lora` ({', '.join(f'`{flag}`' for flag in LORA_FLAGS)}) | " + " | ".join(lora) + " |")
    return "\n".join(lines) + "\n"


def refusal_reasons() -> str:
    """One Markdown line per refused cell, by feature: the card's reason (the one its load error gives)."""
    lines = ["Why not, per feature and kind:"]
    for name in FEATURES:
        for label, caps in capability_rows().items():
            if name not in caps.supported:
                lines.append(f"- `{name}` on {label}: {caps.why(name)}")
    for label, (caps, family) in _rows().items():
        refused = _lora_refusal(caps, family)
        if refused is not None:
            lines.append(f"- `lora` on {label}: {refused}")
    return "\n".join(lines) + "\n"


def _lora_refusal(caps: Capabilities, family: Family) -> str | None:
    return NO_LORA if family.lora is None else caps.lora_why_not


def print_capabilities() -> int:
    print(capability_table() + "\n" + refusal_reasons(), end="")
    return 0
