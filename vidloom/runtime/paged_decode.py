"""The engine's AR side: one paged KV pool for every AR loop, and their decode steps as one forward.

Every loop that decodes token by token (a chat's ARDecodeLoop, a unified model's reasoner) reserves
its sequence's blocks here through `LoopContext.reserve_kv` and plans paged decode steps
(`core.loop.KV_SEQUENCE`). Whoever steps the requests (the AsyncEngine's worker, or a run stepped
alone) hands those plans to `PagedDecoder.run`: their new tokens are packed along one axis (a whole
prompt for a sequence that just joined, else its last token), the pool resolves what each token
attends to, and the lm head runs on each sequence's last token only. Sequences join and leave
between steps, whichever request owns them, so a reasoning request's steps share the chat batch.

A program may name other AR networks (`Program.paged_networks`, a speech model's talker): each gets a pool
of its own layout (layers, KV heads, head size), sized by the same kv_pool_tokens, and the decode steps of
all its sequences run as one forward too (one forward per network per round).

Under cuda_graphs, a round's decode steps (one token per sequence) of a network that declares graphs replay a
graph captured per batch-size bucket (runtime.decode_graphs); prefills and media steps stay eager.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Sequence

import torch
from torch import Tensor

from vidloom.core.chat import ChatLimits, ChatRequest
from vidloom.core.errors import CacheBudgetExceeded, DeployError, InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import KV_SEQUENCE, Loop, StepPlan
from vidloom.core.program import Node, Program
from vidloom.decoding.loop import AR_DECODE, ChatPrompt
from vidloom.runtime.cache_manager import CacheManager
from vidloom.runtime.cudagraph import StepGraphs
from vidloom.runtime.decode_graphs import DECODE_GRAPH_MAX_CONTEXT, DecodeGraphs, declares_graphs
from vidloom.runtime.paged_kv import BLOCK_SIZE, KVLayout, PagedKVPool

DEFAULT_KV_POOL_TOKENS = 16384  # --kv-pool-tokens default: 1024 blocks of 16
WANT_HIDDEN = "want_hidden"
"""A paged decode plan input: True asks for the final hidden states of the plan's tokens too (a speech model's
thinker feeds its talker with them); the plan's result is then (logits [vocab], hidden [tokens, hidden]) and the
network must accept `return_hidden=True`."""
EMBEDS_AT = "embeds_at"
"""A paged decode plan input: (index [K] into the plan's tokens, rows [K, width]) whose rows replace those
tokens' input embeddings (a multimodal prompt's placeholders take their encoder's output); the network must
accept `embeds_at=(index, rows)` over the packed batch. `rows` may be a callable that makes them: it runs in
the step, on the device's thread (a prompt's encoders run with its prefill, so a chat's steps stay decode steps)."""
INPUT_EMBEDS = "embeds"
"""A paged decode plan input in place of "tokens": input rows [n, width] of a network fed embeddings (a talker's
thinker-space rows); the network must accept `inputs_embeds=` (with None for the ids)."""
AFTER_FORWARD = "after_forward"
"""A paged decode plan input: a callable (plans, rows) -> rows that one network's plans pass their rows through
right after their forward, on the device's thread (a talker's code predictor runs once for every sequence of the
step); every plan of that network carries the same one."""
DEFAULT_MAX_TOKENS = 1024  # completion tokens when a request sets no max_tokens (capped by the window)
GRAPH_ROWS = 2
"""Rows of a graphed decode step charged to each chat (memory_bytes): batch_bucket(B) < 2B for every B."""
KEY_SLOT_BYTES = 8  # an int64 pool slot per gathered key (PagedBatch / DecodeKV key_slots)


class PagedDecoder:
    """The paged KV pool of one loaded instance, the chat limits it implies, and the batched decode forward."""

    def __init__(self, instance: ModelInstance, loop: Any, caches: CacheManager,
                 pool_tokens: int | None = None, networks: Sequence[Any] = (), graphs: StepGraphs | None = None) -> None:
        """`graphs`: the engine's step graphs under cuda_graphs; decode steps of networks that declare graphs replay
        them (runtime.decode_graphs), their pools then holding a scratch block for the padding rows."""
        self.instance, self.loop = instance, loop
        self._graphs = DecodeGraphs(graphs) if graphs is not None else None
        tokens = pool_tokens if pool_tokens is not None else DEFAULT_KV_POOL_TOKENS
        self.pool = _allocate_pool(instance, caches, loop.network, tokens, instance.dtype, "", graphs is not None)
        # The pool of each AR network by identity: the chat loop's, then the program's others (in their dtype).
        self._pools: dict[int, PagedKVPool] = {id(loop.network): self.pool}
        for i, network in enumerate(networks):
            dtype = next(network.parameters()).dtype
            self._pools[id(network)] = _allocate_pool(instance, caches, network, tokens, dtype, f":{i + 1}",
                                                      graphs is not None)
        layout = self.pool.layout
        window = min(instance.card.context_window or 2, layout.num_blocks * layout.block_size)
        self.limits = ChatLimits(context_window=window, max_tokens=max(1, window - 1),
                                 default_max_tokens=min(DEFAULT_MAX_TOKENS, max(1, window - 1)))
        self.program = Program(nodes=(Node(AR_DECODE, reads=("chat",), writes=("completion",), loop=loop),),
                               inputs=frozenset({"chat"}), outputs=("completion",))
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.tokens_generated_total = 0  # chat tokens (a reasoner's are its request's, not a chat's)

    # -- admission (any thread) ---------------------------------------------------------

    def chat_slots(self, request: ChatRequest) -> dict[str, Any]:
        """Validate and tokenize `request` against the limits: the chat program's input slots.

        Raises InvalidRequest naming the field before anything is held.
        """
        request.validate(self.limits)
        prompt, media = self.loop.prepare(request)
        budget = request.sampling.completion_budget(len(prompt), self.limits)
        return {"chat": ChatPrompt(request, tuple(prompt), budget, media=media)}

    def memory_bytes(self, prompt: ChatPrompt) -> int:
        """A chat's decode working set beyond the weights and the pool, for the engine's admission ledger
        (runtime.admission): its prefill forward, the largest step, over all its prompt tokens at once.

        Per layer (PyTorch frees one layer's intermediates before the next): the residual stream, its norm,
        q/k/v and the attention output (~6 x hidden per token), the MLP's gate, up and product (3 x intermediate),
        the keys and values gathered from the pool (PagedBatch.attend), the boolean mask and the attention scores
        (heads x tokens x context, float32 when a math kernel materialises them); then the last token's float32
        logits. The KV blocks live in the pool, allocated at load (not counted here). Sized for the whole
        context (prompt + max_tokens), the widest any of its steps attends over. A prompt with media (audio,
        images) adds its encoders' pass, which runs inside the prefill step (the loop's `media_bytes`). The key
        slots (int64, one per gathered key) live through the whole forward.

        Under cuda_graphs a decode step of B chats runs batch_bucket(B) rows, fewer than 2B, each gathering keys as
        wide as the step's widest rounded up to a power of two of blocks, at most DECODE_GRAPH_MAX_CONTEXT
        (decode_graphs): every chat is charged for GRAPH_ROWS rows (its own and one padding row) of that many keys,
        key slots and scores, of the per-token activations, and of the logits the graphed step hands back (a copy
        of every bucket row, in the model's dtype, before the real rows are cut and made float32). The graphs' own
        memory (static inputs, their pool) is on the ledger apart (runtime.graph_memory).
        """
        config = self.loop.network.config
        tokens, context = len(prompt.prompt_ids), len(prompt.prompt_ids) + prompt.max_tokens
        hidden = int(getattr(config, "hidden_size", 0))
        inner = int(getattr(config, "intermediate_size", 4 * hidden))
        heads = int(getattr(config, "num_attention_heads", 1))
        vocab = int(getattr(config, "vocab_size", 0))
        kv_width = int(config.num_key_value_heads) * int(config.head_dim)  # the pool's layout reads the same
        element = torch.empty((), dtype=self.instance.dtype).element_size()
        graphed = self._graphs is not None and declares_graphs(self.loop.network)
        keys = max(context, GRAPH_ROWS * DECODE_GRAPH_MAX_CONTEXT) if graphed else context
        rows = max(tokens, GRAPH_ROWS) if graphed else tokens
        per_layer = (rows * (6 * hidden + 3 * inner) * element + 2 * keys * kv_width * element
                     + max(tokens * context, keys) * (1 + 4 * heads))
        logits = vocab * 4 + (GRAPH_ROWS * vocab * element if graphed else 0)
        media = 0 if prompt.media is None else self.loop.media_bytes(prompt.media)
        return per_layer + KEY_SLOT_BYTES * keys + logits + media

    def pool_of(self, network: Any = None) -> PagedKVPool:
        """The pool of `network` (None: the chat loop's); ValueError for a network the program did not name."""
        pool = self._pools.get(id(network if network is not None else self.loop.network))
        if pool is None:
            raise ValueError(f"{type(network).__name__} has no paged KV pool: name it in Program.paged_networks")
        return pool

    def reserve(self, owner: str, tokens: int, network: Any = None) -> str:
        """Blocks in `network`'s pool for one sequence of `owner` (a request id); its id (unique across pools).
        CacheBudgetExceeded if they do not fit."""
        pool = self.pool_of(network)
        seq_id = f"{owner}#{next(self._ids)}"
        pool.allocator.reserve(seq_id, tokens)
        return seq_id

    def release(self, seq_id: str) -> None:
        for pool in self._pools.values():  # ids are unique across pools: only its own pool holds it
            pool.allocator.release(seq_id)

    def stats(self) -> dict[str, int]:
        """Tokens the chats generated, and blocks in use and in all, summed over every pool."""
        allocators = [pool.allocator for pool in self._pools.values()]
        return {"tokens_generated_total": self.tokens_generated_total,
                "kv_blocks_in_use": sum(a.blocks_in_use for a in allocators),
                "kv_blocks_total": sum(a.num_blocks for a in allocators)}

    # -- the device's thread -------------------------------------------------------------

    @staticmethod
    def groups(plans: Sequence[StepPlan]) -> list[list[int]]:
        """Indices of `plans` by network, in first-seen order: each group is one forward."""
        by_network: dict[int, list[int]] = {}
        for i, plan in enumerate(plans):
            by_network.setdefault(id(plan.call), []).append(i)
        return list(by_network.values())

    def run(self, plans: Sequence[StepPlan]) -> list[Any]:
        """Execute paged decode plans: one forward per network (`groups`); each plan's last-token logits [vocab],
        on the host as float32 (one device->host copy per forward; sampling runs per sequence on the host)."""
        rows: list[Any] = [None] * len(plans)
        for group in self.groups(plans):
            grouped = [plans[i] for i in group]
            after = grouped[0].inputs.get(AFTER_FORWARD)
            out = self._forward(grouped)
            for i, row in zip(group, out if after is None else after(grouped, out)):
                rows[i] = row
        return rows

    def _forward(self, plans: Sequence[StepPlan]) -> list[Any]:
        """One forward of `plans` (one network) over their packed new tokens or input rows: replayed from a captured
        graph when every plan decodes one token (runtime.decode_graphs, under cuda_graphs), else eagerly."""
        network = plans[0].call
        embedded = INPUT_EMBEDS in plans[0].inputs
        if any((INPUT_EMBEDS in p.inputs) != embedded for p in plans):
            raise ValueError("paged decode plans of one network must all give tokens or all give embeds")
        key = INPUT_EMBEDS if embedded else "tokens"
        sizes = [int(p.inputs[key].shape[0]) for p in plans]
        want_hidden = any(p.inputs.get(WANT_HIDDEN) for p in plans)
        media = any(p.inputs.get(EMBEDS_AT) is not None for p in plans)
        with torch.inference_mode():
            out = None
            if self._graphs is not None and not media:
                out = self._graphs.forward(network, self.pool_of(network), plans, key, want_hidden)
            logits, hidden = out if out is not None else self._eager(plans, key, sizes, want_hidden, media)
            logits = logits.float().cpu()
        with self._lock:
            self.tokens_generated_total += sum(p.loop == AR_DECODE for p in plans)
        rows: list[Any] = list(logits.unbind(0))
        if hidden is not None:  # each asking plan also gets its own tokens' final hidden states [n, hidden]
            for i, (plan, part) in enumerate(zip(plans, hidden.split(sizes))):
                if plan.inputs.get(WANT_HIDDEN):
                    rows[i] = (rows[i], part)
        return rows

    def _eager(self, plans: Sequence[StepPlan], key: str, sizes: list[int], want_hidden: bool,
               media: bool) -> tuple[Tensor, Tensor | None]:
        """The plans' forward over their packed tokens, attending through a PagedBatch: last-token logits, hidden."""
        network = plans[0].call
        packed = torch.cat([p.inputs[key] for p in plans])
        positions = torch.cat([p.inputs["positions"] for p in plans], dim=1)
        last = torch.tensor(sizes, device=packed.device).cumsum(0) - 1
        kv = self.pool_of(network).batch(
            [(p.inputs[KV_SEQUENCE], p.inputs["start"], n) for p, n in zip(plans, sizes)], network.attention_scale)
        embedded = key == INPUT_EMBEDS
        extra: dict[str, Any] = {"inputs_embeds": packed} if embedded else {}
        if media:
            extra[EMBEDS_AT] = _packed_embeds(plans, sizes)
        ids = None if embedded else packed
        if want_hidden:
            return network(ids, positions, kv=kv, logits_at=last, return_hidden=True, **extra)
        return network(ids, positions, kv=kv, logits_at=last, **extra), None


def _allocate_pool(instance: ModelInstance, caches: CacheManager, network: Any, tokens: int, dtype: torch.dtype,
                   suffix: str, graphed: bool) -> PagedKVPool:
    """A pool of `tokens` tokens laid out for `network`, from the engine's cache budget (DeployError: no room);
    `graphed` (cuda_graphs on) adds the scratch block a captured decode's padding rows write to, where the network
    declares graphs."""
    config = network.config
    layout = KVLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                      num_blocks=max(1, tokens // BLOCK_SIZE), scratch_blocks=int(graphed and declares_graphs(network)))
    try:
        _, pool = caches.allocate("kv-pool:" + instance.card.model_id + suffix, layout.nbytes(dtype),
                                  lambda: PagedKVPool(layout, instance.device, dtype))
    except CacheBudgetExceeded as exc:
        raise DeployError(f"the paged KV pools (kv_pool_tokens={tokens}, --kv-pool-tokens) need "
                          f"{exc.needed} more bytes than kv_cache_budget_bytes (--kv-cache-budget-mb) has "
                          f"free ({exc.budget - exc.in_use}); lower one or raise the other") from None
    return pool


def _packed_embeds(plans: Sequence[StepPlan], sizes: list[int]) -> tuple[Tensor, Tensor]:
    """The plans' EMBEDS_AT inputs over the packed batch: their indices shifted by where each plan's tokens start."""
    indices, rows, offset = [], [], 0
    for plan, size in zip(plans, sizes):
        given = plan.inputs.get(EMBEDS_AT)
        if given is not None:
            indices.append(given[0] + offset)
            rows.append(given[1]() if callable(given[1]) else given[1])
        offset += size
    return torch.cat(indices), torch.cat(rows)


def build_decoder(instance: ModelInstance, program: Program, caches: CacheManager,
                  graphs: StepGraphs | None = None) -> PagedDecoder | None:
    """The engine's AR side when its program has a chat loop (None otherwise); `graphs`: see PagedDecoder."""
    loop: Loop[Any] | None = program.chat_loop
    if loop is None:
        return None
    return PagedDecoder(instance, loop, caches, instance.deploy.kv_pool_tokens, program.paged_networks, graphs)


def no_chat(model_id: str) -> InvalidRequest:
    return InvalidRequest("model", f"{model_id} does not support chat (its card has no ar_decode loop); "
                                   "use a chat-capable checkpoint such as a Cosmos3 Omni folder")
