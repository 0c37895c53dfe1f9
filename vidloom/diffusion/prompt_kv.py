"""One request's prepared prompt keys and values (layers.prompt_kv): computed on a branch's first step, reused after.

The loop asks for a step's prompt and negative embeddings through `PreparedPrompts.get(network, embeds)` while it
plans the step (outside any captured graph and before cross-request batching stacks the plans), under the
request's LoRA scope. An entry is keyed by the network it was prepared for (each Wan2.2 A14B expert has its own
keys and values), the embeddings (a live prompt swapped mid-request is a new entry) and the active adapter set
(K/V are prepared after the request's adapters are applied to the k/v projections; a different set prepares
again). Entries hold what they key by, so the identities stay theirs while the entry lives. What a network's
steps read besides the prompt, the same for every branch (Wan I2V's CLIP image K/V), it prepares the same way
once per request through `PreparedPrompts.network(network)`, keyed by the network alone. Under CUDA graphs a
prompt whose padding keys collapsed (layers.prompt_kv: Wan's, Helios') is padded to a key-count bucket (`bucket`),
so prompts of one bucket share a captured step.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from vidloom.layers.prompt_kv import PromptKV
from vidloom.lora.apply import current_loras

PREPARED_PROMPTS = 6
"""Entries one request keeps (least recently used first out): CFG's two branches and the network's own (an I2V
view's image K/V) for each of Wan2.2 A14B's two experts. A request that swaps its prompt (Helios' live prompts)
drops the oldest."""


class PreparedPrompts:
    """The prompt K/V one request's steps read; owned by the request's loop state, never by a shared module."""

    def __init__(self, enabled: bool = True, bucket: int | None = None) -> None:
        """`enabled` False: every step gets the embeddings themselves (the per-step projection). `bucket` (the run
        captures its steps: runtime.prompt_buckets.PROMPT_BUCKET): collapsed prompt keys are padded to a multiple
        of it with masked filler (PromptKV.bucketed)."""
        self.enabled = enabled
        self.bucket = bucket
        self._entries: OrderedDict[tuple[int, int, int], tuple[Any, Any, Any, Any]] = OrderedDict()
        self.prepared = 0
        """How many times a network prepared a prompt (tests count the projections by it)."""

    def get(self, network: Any, embeds: Any) -> Any:
        """What the step passes as `embeds` (a tensor, or a family's text batch) to `network`: its prepare_prompt
        (PromptKV, or the family's text with them), or `embeds` itself where the network cannot prepare them (it
        declares no `prepare_prompt`, or answers None: LTX-2.3's timestep-modulated text). None stays None (no CFG
        branch)."""
        prepare = getattr(network, "prepare_prompt", None)
        if embeds is None or not self.enabled or prepare is None:
            return embeds
        prepared = self._prepared(network, embeds, lambda: self._bucketed(prepare(embeds)))
        return embeds if prepared is None else prepared

    def _bucketed(self, prepared: Any) -> Any:
        if self.bucket is None or not isinstance(prepared, PromptKV):
            return prepared
        return prepared.bucketed(self.bucket)

    def network(self, network: Any) -> Any:
        """The network a step calls: its `prepare_network()` (a per-request view with what every step and branch
        reads besides the prompt prepared: Wan I2V's image keys/values), prepared once and kept like a prompt's;
        `network` itself where it declares none or answers None."""
        prepare = getattr(network, "prepare_network", None)
        if not self.enabled or prepare is None:
            return network
        prepared = self._prepared(network, None, prepare)
        return network if prepared is None else prepared

    def _prepared(self, network: Any, embeds: Any, prepare: Callable[[], Any]) -> Any:
        """The entry of (network, embeds, active adapters), prepared on first use; None where `prepare` is."""
        active = current_loras()
        key = (id(network), id(embeds), id(active))
        entry = self._entries.get(key)
        if entry is None:
            kv = prepare()
            if kv is None:
                return None
            self.prepared += 1
            entry = self._entries[key] = (network, embeds, active, kv)
            while len(self._entries) > PREPARED_PROMPTS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return entry[3]

    @property
    def nbytes(self) -> int:
        """Bytes of the kept keys and values."""
        return sum(_nbytes(entry[3]) for entry in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()


def _nbytes(prepared: Any) -> int:
    """Bytes of a prepared prompt (PromptKV, a text batch's `kv`, or a family's own with `nbytes`: LTX-2's) or
    network view (its `image_kv`)."""
    kv = getattr(prepared, "kv", getattr(prepared, "image_kv", prepared))
    nbytes = getattr(kv, "nbytes", 0)
    return nbytes if isinstance(nbytes, int) else 0
