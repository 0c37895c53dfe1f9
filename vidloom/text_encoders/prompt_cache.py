"""An LRU of prompt embeddings (prompt_cache_size): a repeated prompt or negative prompt skips the encoder."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Callable, Iterable

import torch


class EmbeddingCache:
    """A thread-safe LRU of prompt embeddings; capacity 0 disables it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def put(self, key: str, value: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def embed(self, prompts: list[str], run: Callable[[list[str]], Iterable[torch.Tensor]]) -> list[torch.Tensor]:
        """The embedding of each prompt (keyed by its sha256): cached ones from here, the others from one `run`
        over the distinct missing prompts (first-seen order), which are then cached."""
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        found = {key: emb for key in keys if (emb := self.get(key)) is not None}
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            texts = dict(zip(keys, prompts))
            for key, emb in zip(missing, run([texts[k] for k in missing])):
                self.put(key, emb)
                found[key] = emb
        return [found[key] for key in keys]
