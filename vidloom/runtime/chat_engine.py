"""ChatEngine: admits chat requests onto a paged KV pool and steps every running sequence together.

`admit` validates, builds the prompt and reserves the sequence's KV blocks (CacheBudgetExceeded
before any work when the pool cannot hold prompt + max_tokens); `step` runs one batched forward
over all running sequences (new ones prefill in the same forward) and hands each its next
TokenDelta, then its ChatResult. Sequences join and leave between steps. Whoever owns the device
calls `step` (the AsyncEngine's worker, or the caller's thread for the sync API); admission and
cancellation may come from any thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from vidloom.core.chat import ChatLimits, ChatRequest, ChatResult, TokenDelta
from vidloom.core.errors import CacheBudgetExceeded, DeployError, InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import Done, StepPlan
from vidloom.core.program import Program
from vidloom.decoding.loop import ARDecodeLoop, ChatPrompt, DecodeState
from vidloom.runtime.ar_batching import run_decode_batch
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.paged_kv import BLOCK_SIZE, KVLayout, PagedKVPool

log = logging.getLogger(__name__)

AR_LOOP = "ar_decode"
DEFAULT_KV_POOL_TOKENS = 16384  # --kv-pool-tokens default: 1024 blocks of 16
DEFAULT_MAX_TOKENS = 1024  # completion tokens when a request sets no max_tokens (capped by the window)
ChatItem = TokenDelta | ChatResult | BaseException
ChatSink = Callable[[ChatItem], None]
"""Receives a sequence's deltas, then its ChatResult, or the exception it failed with (worker thread)."""


def chat_loop(program: Program) -> ARDecodeLoop | None:
    """The program's "ar_decode" loop, if it has one."""
    for node in program.nodes:
        if node.loop is not None and node.loop.name == AR_LOOP:
            return node.loop  # type: ignore[return-value]
    return None


@dataclass
class _Sequence:
    state: DecodeState
    sink: ChatSink


class _Reservation:
    """The DecodeContext of one admission: reserves the sequence's blocks in the pool."""

    def __init__(self, pool: PagedKVPool, seq_id: str, device: torch.device) -> None:
        self.pool, self.seq_id, self.device = pool, seq_id, device

    def reserve_kv(self, tokens: int) -> str:
        self.pool.allocator.reserve(self.seq_id, tokens)
        return self.seq_id


class ChatEngine:
    """AR decode over one loaded instance with continuous batching on a paged KV pool."""

    def __init__(self, instance: ModelInstance, loop: ARDecodeLoop, caches: CacheManager,
                 pool_tokens: int | None = None) -> None:
        self.instance, self.loop = instance, loop
        config = loop.network.config
        tokens = pool_tokens if pool_tokens is not None else DEFAULT_KV_POOL_TOKENS
        layout = KVLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                          num_blocks=max(1, tokens // BLOCK_SIZE))
        try:
            self._handle, self.pool = caches.allocate(
                "kv-pool:" + instance.card.model_id, layout.nbytes(instance.dtype),
                lambda: PagedKVPool(layout, instance.device, instance.dtype))
        except CacheBudgetExceeded as exc:
            raise DeployError(f"the chat KV pool (kv_pool_tokens={tokens}, --kv-pool-tokens) needs "
                              f"{exc.needed} bytes, more than kv_cache_budget_bytes (--kv-cache-budget-mb) has "
                              f"free ({exc.budget - exc.in_use}); lower one or raise the other") from None
        window = min(instance.card.context_window or 2, layout.num_blocks * layout.block_size)
        self.limits = ChatLimits(context_window=window, max_tokens=max(1, window - 1),
                                 default_max_tokens=min(DEFAULT_MAX_TOKENS, max(1, window - 1)))
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._running: dict[str, _Sequence] = {}
        self._cancelled: set[str] = set()
        self._ids = itertools.count(1)
        self.tokens_generated_total = 0

    # -- any thread ------------------------------------------------------------------

    def admit(self, request: ChatRequest, sink: ChatSink) -> str:
        """Validate, tokenize and reserve KV for `request`; the sequence runs from the next `step`.

        Raises InvalidRequest (naming the field) or CacheBudgetExceeded before anything is held.
        """
        request.validate(self.limits)
        prompt = self.loop.prompt(request)
        budget = request.sampling.completion_budget(len(prompt), self.limits)
        chat = ChatPrompt(request, tuple(prompt), budget)
        seq_id = f"{request.request_id}#{next(self._ids)}"
        state = self.loop.init({"chat": chat}, _Reservation(self.pool, seq_id, self.instance.device))
        with self._lock:
            self._running[seq_id] = _Sequence(state, sink)
        return seq_id

    def cancel(self, seq_id: str) -> bool:
        """Stop the sequence at the next step (its blocks return then); False if it is not running."""
        with self._lock:
            if seq_id not in self._running:
                return False
            self._cancelled.add(seq_id)
            return True

    def cancel_all(self) -> None:
        """Stop every running sequence at the next step (engine shutdown)."""
        with self._lock:
            self._cancelled.update(self._running)

    @property
    def has_work(self) -> bool:
        with self._lock:
            return bool(self._running)

    def stats(self) -> dict[str, Any]:
        allocator = self.pool.allocator
        with self._lock:
            running = len(self._running)
        return {"tokens_generated_total": self.tokens_generated_total, "kv_blocks_in_use": allocator.blocks_in_use,
                "kv_blocks_total": allocator.num_blocks, "sequences_running": running}

    def stream(self, request: ChatRequest) -> Iterator[TokenDelta | ChatResult]:
        """Run `request` to the end in this thread, yielding its deltas then its ChatResult.

        For the sync API: call only where nothing else steps this engine. Closing the iterator
        early cancels the sequence and returns its blocks before it returns.
        """
        items: list[ChatItem] = []
        seq_id = self.admit(request, items.append)
        try:
            while True:
                if not items:
                    self.step()
                ready, items[:] = list(items), []
                for item in ready:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if isinstance(item, ChatResult):
                        return
        finally:
            if self.cancel(seq_id):
                self.step()  # reaps it: its blocks return now

    # -- the device's thread -----------------------------------------------------------

    def step(self) -> int:
        """Reap cancelled sequences, then run one batched decode step over the rest; how many stepped.

        Steps are serialized (a second caller waits), so the sync API and a device worker sharing one
        engine cannot interleave inside a step.
        """
        with self._step_lock:
            return self._step()

    def _step(self) -> int:
        with self._lock:
            cancelled = [(s, self._running.pop(s)) for s in self._cancelled if s in self._running]
            self._cancelled.clear()
            running = list(self._running.items())
        for seq_id, seq in cancelled:
            self._end(seq_id, seq, None)
        plans = []
        for seq_id, seq in running:
            plan = self.loop.next(seq.state)
            if isinstance(plan, Done):
                self._finish(seq_id, seq)
            else:
                plans.append((seq_id, seq, plan))
        if plans:
            self._run(plans)
        return len(plans)

    def _run(self, plans: list[tuple[str, _Sequence, StepPlan]]) -> None:
        try:
            with torch.inference_mode():
                # One device->host copy per step; sampling runs per sequence on the host (loop.advance).
                rows = torch.stack(run_decode_batch([p for _, _, p in plans], self.pool)).float().cpu()
        except Exception as exc:
            if len(plans) == 1:
                log.exception("chat sequence %s failed", plans[0][0])
                self._end(plans[0][0], plans[0][1], exc)
                return
            # Failure isolation: rerun each alone, so only a sequence whose own step fails fails.
            log.warning("batched decode step of %d sequences failed; running them one by one", len(plans))
            for item in plans:
                self._run([item])
            return
        for (seq_id, seq, _), logits in zip(plans, rows):
            try:
                self.loop.advance(seq.state, logits)
            except Exception as exc:
                self._end(seq_id, seq, exc)
                continue
            self.tokens_generated_total += 1
            self._drain(seq)
            if seq.state.finish_reason is not None:
                self._finish(seq_id, seq)

    def _drain(self, seq: _Sequence) -> None:
        deltas, seq.state.deltas = seq.state.deltas, []
        for delta in deltas:
            try:
                seq.sink(delta)
            except Exception:  # a subscriber's bug must not stop the other sequences
                log.exception("chat sink failed on a delta of %s", delta.request_id)

    def _finish(self, seq_id: str, seq: _Sequence) -> None:
        self._end(seq_id, seq, self.loop.finalize(seq.state)["completion"])

    def _end(self, seq_id: str, seq: _Sequence, outcome: ChatResult | BaseException | None) -> None:
        """The one release path: blocks back to the pool, then the sequence's last item."""
        with self._lock:
            self._running.pop(seq_id, None)
            self._cancelled.discard(seq_id)
        self.pool.allocator.release(seq_id)
        if outcome is None:  # cancelled: the result says so (never a success for a client)
            outcome = self.loop.finalize(seq.state)["completion"]
            if outcome.finish_reason != "cancelled":
                outcome = ChatResult(outcome.request_id, outcome.text, "cancelled", outcome.prompt_tokens,
                                     outcome.completion_tokens, outcome.time_to_first_token_s, outcome.token_ids)
        try:
            seq.sink(outcome)
        except Exception:  # a subscriber's bug must not stop the other sequences
            log.exception("chat sink failed for %s", seq_id)


def build_chat_engine(instance: ModelInstance, program: Program, caches: CacheManager) -> ChatEngine | None:
    """The engine's chat side when its program has an "ar_decode" loop (None otherwise)."""
    loop = chat_loop(program)
    if loop is None:
        return None
    return ChatEngine(instance, loop, caches, instance.deploy.kv_pool_tokens)


def no_chat(model_id: str) -> InvalidRequest:
    return InvalidRequest("model", f"{model_id} does not support chat (its card has no ar_decode loop); "
                                   "use a chat-capable checkpoint such as a Cosmos3 Omni folder")
