"""Incremental detokenization: text a sequence may show now, holding back pending characters and stop strings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Detokenizer:
    """Completion ids -> text, emitted in pieces; finds stop strings across token boundaries.

    Decoding the whole completion each step keeps multi-byte characters and merges right (a
    byte-level BPE may split one character over tokens: the partial decode ends in U+FFFD, held
    back until it completes). Ids past the tokenizer's vocabulary (the model's padded rows) decode to "".
    """

    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""  # the completion's text so far (stop string excluded once found)
    emitted: int = 0  # characters of `text` already handed out
    stopped: bool = False

    def __post_init__(self) -> None:
        self._vocab = len(self.tokenizer)

    def add(self, token_id: int) -> str:
        """Fold in one token; return the text that became safe to show."""
        self.ids.append(token_id)
        known = [i for i in self.ids if i < self._vocab]
        text = self.tokenizer.decode(known, skip_special_tokens=True)
        for s in self.stop:
            at = text.find(s)
            if at != -1:
                self.text, self.stopped = text[:at], True
                return self._take(len(self.text))
        self.text = text
        safe = len(text)
        if text.endswith("\ufffd"):  # an incomplete character: wait for its remaining bytes
            safe = len(text.rstrip("\ufffd"))
        safe -= self._pending_stop(text[:safe])
        return self._take(max(safe, self.emitted))

    def flush(self) -> str:
        """Everything not yet handed out (the sequence ended)."""
        return self._take(len(self.text))

    def _pending_stop(self, text: str) -> int:
        """Length of the longest suffix of `text` that starts a stop string (it may yet complete)."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _take(self, upto: int) -> str:
        piece = self.text[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return piece
