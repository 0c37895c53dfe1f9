"""Prompt-length buckets under --cuda-graphs: a captured step's signature holds its inputs' shapes, so a step that
read each prompt at its own token count would capture a graph (and hold its static buffers) per prompt length. A
family that pads each prompt's tokens to the next bucket and masks the padding keys (SDPA's boolean key mask: their
attention weights are exactly zero) serves every prompt length of one bucket with one graph. Used by Cosmos3 (its
prefix K/V), HunyuanVideo-1.5 (its text and glyph condition tokens), and Wan's and Helios' collapsed prompt padding
keys (layers.prompt_kv, `prompt_bucket`)."""

from __future__ import annotations

from vidloom.core.loop import LoopContext

PROMPT_BUCKET = 64
"""Prompt-length bucket under cuda_graphs: a prompt's tokens are padded to the next multiple of this many, so prompts
within one bucket share a captured step. Multiples of 64 rather than powers of two: the padding a request attends
over (and holds in its buffers) stays under 64 rows, and a deployment's prompts, a chat template plus a caption of a
few hundred tokens, fall into a handful of buckets, each one set of graphs."""


def bucket_length(tokens: int, bucket: int = PROMPT_BUCKET) -> int:
    """The padded length of a `tokens`-token prompt under cuda_graphs (at least one bucket)."""
    if tokens < 0 or bucket < 1:
        raise ValueError(f"bucket_length needs tokens >= 0 and bucket >= 1 (got tokens={tokens}, bucket={bucket})")
    return max(1, -(-tokens // bucket)) * bucket


def prompt_bucket(ctx: LoopContext | None) -> int | None:
    """The key-count bucket a loop's prepared prompts are padded to (diffusion.prompt_kv.PreparedPrompts): PROMPT_BUCKET
    when the run captures its steps (LoopContext.captures_steps), else None (each prompt at its own count). `ctx`
    None (a loop driven by hand, as tests do) captures nothing."""
    return PROMPT_BUCKET if ctx is not None and ctx.captures_steps else None
