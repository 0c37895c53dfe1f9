"""Checkpoint key <-> module parameter name translation, as data.

A NameMap is an ordered table of prefix rules. `{n}` in a rule matches one run of
digits (a layer index) and is carried over to the other side. Keys that match no
rule keep their name. Rules apply in both directions, so the same table loads a
diffusers checkpoint onto our modules and writes our modules back out in that layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


def _compile(template: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in template.split("{n}")]
    body = r"(\d+)".join(parts)
    # A prefix matches whole dotted segments only ("blocks.1" must not match "blocks.10").
    return re.compile(rf"^{body}(?=\.|$)")


def _fill(template: str, numbers: tuple[str, ...]) -> str:
    pieces = template.split("{n}")
    out = pieces[0]
    for number, piece in zip(numbers, pieces[1:]):
        out += number + piece
    return out


@dataclass(frozen=True)
class NameMap:
    """Ordered (checkpoint_prefix, module_prefix) rules; first match wins."""

    rules: tuple[tuple[str, str], ...]
    _forward: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _backward: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for ckpt, ours in self.rules:
            if ckpt.count("{n}") != ours.count("{n}"):
                raise ValueError(f"rule {ckpt!r} -> {ours!r}: '{{n}}' counts differ")
        object.__setattr__(self, "_forward", tuple(_compile(c) for c, _ in self.rules))
        object.__setattr__(self, "_backward", tuple(_compile(o) for _, o in self.rules))

    def to_module(self, checkpoint_key: str) -> str:
        """Name of the module parameter that a checkpoint key loads into."""
        return self._translate(checkpoint_key, self._forward, 1)

    def to_checkpoint(self, module_key: str) -> str:
        """Checkpoint key that a module parameter is saved under."""
        return self._translate(module_key, self._backward, 0)

    def _translate(self, key: str, patterns: tuple[re.Pattern[str], ...], side: int) -> str:
        for pattern, rule in zip(patterns, self.rules):
            match = pattern.match(key)
            if match:
                return _fill(rule[side], match.groups()) + key[match.end():]
        return key


def causal_lm_map(prefix: str, layer_rules: tuple[tuple[str, str], ...]) -> NameMap:
    """A transformers causal LM's keys under `prefix` (its `model.embed_tokens`, `model.layers.*` through
    `layer_rules`, `model.norm` and `lm_head`) -> a decoder's `embed`, blocks, `norm` and `head`."""
    return NameMap(((f"{prefix}.model.embed_tokens", "embed"), *((f"{prefix}.model.{a}", b) for a, b in layer_rules),
                    (f"{prefix}.model.norm", "norm"), (f"{prefix}.lm_head", "head")))
