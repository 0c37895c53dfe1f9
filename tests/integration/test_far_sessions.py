"""Continuation sessions on AnyFlow-FAR through the Python API: extend_from, resident vs rebuilt KV, release."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.far_checkpoints import FAR_A, FAR_B, write_tiny_far
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.output import ProgressEvent
from vidloom.core.request import GenerationRequest
from vidloom.core.session import VideoSession
from vidloom.generator import VideoGenerator
from vidloom.families.wan_causal.kv_cache import FarKVCache
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.loop import SESSION, rebuild_session_kv
from vidloom.runtime.engine import CancellationToken

SIZE = dict(height=32, width=48)
SOURCE = dict(num_frames=9, num_inference_steps=2, seed=1, **SIZE)  # latent partition (1, 2)
EXTEND = dict(num_frames=21, num_inference_steps=2, seed=2)  # + 3 latent frames: chunks (2, 1)


@pytest.fixture(scope="module")
def far_dir(tmp_path_factory) -> Path:
    return write_tiny_far(tmp_path_factory.mktemp("far-sessions"), FAR_A)


@pytest.fixture(scope="module")
def far(far_dir) -> VideoGenerator:
    return VideoGenerator.from_pretrained(far_dir, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))


@pytest.fixture(autouse=True)
def _no_sessions_left(far):
    """Each test starts with an empty cache manager, whatever the one before left."""
    for session_id in far.engine.caches.session_ids():
        far.engine.caches.release_session(session_id)
    yield


def _extend(gen: VideoGenerator, source: Any, prompt: str = "a cat walks on the ice", **kw: Any) -> dict[str, Any]:
    """Run an extension through the engine, returning its float frames (in [0, 1]) and metadata."""
    request = GenerationRequest(prompt=prompt, extend_from=source, **{**EXTEND, **kw})
    outputs = gen.engine.run(request)
    return outputs


def test_resident_and_rebuilt_extensions_give_the_same_frames(far):
    caches = far.engine.caches
    source = far.generate("a red fox runs over snow", **SOURCE)
    assert source.session is not None and source.session.partition == (1, 2)
    assert caches.session_ids() == [source.session.session_id]

    resident = _extend(far, source)
    assert resident["session"]["resumed"] == "resident"
    assert far.release_session(source) and not far.release_session(source)  # as if evicted
    rebuilt = _extend(far, source)
    assert rebuilt["session"]["resumed"] == "rebuilt"
    # Same ops on the same inputs: equal here; 1e-5 is the bound on frames in [0, 1].
    np.testing.assert_allclose(resident["video"], rebuilt["video"], atol=1e-5, rtol=0)
    assert resident["video"].shape[0] == 21 and resident["session"]["partition"] == (1, 2, 2, 1)
    # The source's frames come first, unchanged (its latents are the context, decoded again).
    ours = far.generate("a cat walks on the ice", extend_from=source, **EXTEND)
    assert np.array_equal(ours.frames[:9], source.frames)
    assert ours.metadata["extension"] == {"extend_from": source.session.session_id, "kv": "rebuilt"}
    for session_id in caches.session_ids():
        caches.release_session(session_id)
    assert caches.bytes_in_use == 0


def test_resident_session_kv_equals_the_rebuilt_kv(far):
    """The session the source leaves is exactly what an extension would rebuild from its latents and prompt."""
    source = far.generate("a red fox runs over snow", negative_prompt="blur", guidance_scale=3.0, **SOURCE)
    session = source.session
    resident = far.engine.caches.checkout_session(session.session_id)
    try:
        transformer = far.engine.instance["transformer"]
        layout = ChunkLayout.for_chunk((*session.partition, 2), len(session.partition), (4, 6), transformer.config)
        slab = transformer.new_cache([layout], 2, torch.device("cpu"), torch.float32)
        encode = far.engine.program.nodes[-1].loop.text_encode
        with torch.inference_mode():
            rebuild_session_kv(transformer, encode, session, layout, slab, torch.float32)
        assert isinstance(resident, FarKVCache) and resident.context_tokens == layout.context_tokens
        rows = slice(slab.null, slab.null + slab.context_tokens)
        assert torch.equal(resident.keys, slab.keys[:, :, rows]) and torch.equal(resident.values, slab.values[:, :, rows])
        # The text matters: a rebuild under another prompt is a different KV.
        other = dataclasses.replace(session, prompt="something else entirely")
        with torch.inference_mode():
            rebuild_session_kv(transformer, encode, other, layout, slab, torch.float32)
        assert not torch.equal(resident.keys, slab.keys[:, :, rows])
    finally:
        far.engine.caches.checkin_session(session.session_id)
        far.engine.caches.release_session(session.session_id)


def test_stored_session_round_trips_and_extends_after_a_restart(far, tmp_path):
    source = far.generate("a red fox runs over snow", **SOURCE)
    path = tmp_path / "video.latents"
    source.session.save(path)
    loaded = VideoSession.load(path)
    assert dataclasses.replace(loaded, latents=source.session.latents) == source.session
    assert torch.equal(loaded.latents, source.session.latents)
    resident = _extend(far, source)
    far.engine.caches.release_session(source.session.session_id)  # the restarted process holds nothing
    after_restart = _extend(far, loaded)
    assert after_restart["session"]["resumed"] == "rebuilt"
    np.testing.assert_allclose(resident["video"], after_restart["video"], atol=1e-5, rtol=0)
    for session_id in far.engine.caches.session_ids():
        far.engine.caches.release_session(session_id)


def test_budget_pressure_evicts_sessions_instead_of_refusing(far_dir):
    probe = VideoGenerator.from_pretrained(far_dir, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))
    source = probe.generate("a red fox", **SOURCE)
    session_bytes = probe.engine.caches.bytes_in_use
    resident = probe.generate("a cat", extend_from=source, **EXTEND)
    assert resident.metadata["extension"]["kv"] == "resident"
    # Room for one extension's slab but not for it and the source's session together.
    budget = _peak_slab_bytes(probe, source) + session_bytes - 1
    far = VideoGenerator.from_pretrained(far_dir, device="cpu",
                                         deploy=DeployConfig(kv_session_ttl_s=600, kv_cache_budget_bytes=budget))
    source = far.generate("a red fox", **SOURCE)
    out = far.generate("a cat", extend_from=source, **EXTEND)  # its slab evicts the source's session
    assert out.metadata["extension"]["kv"] == "rebuilt"
    assert np.array_equal(out.frames, resident.frames)  # evicted and rebuilt: the same video
    stats = far.engine.caches.session_stats()
    assert stats["evictions"] >= 1 and far.engine.caches.bytes_in_use <= budget


def _peak_slab_bytes(gen: VideoGenerator, source: Any) -> int:
    from vidloom.media.request_inputs import resolve_request
    from vidloom.families.wan_causal.memory import kv_cache_bytes

    request = resolve_request(GenerationRequest(prompt="x", extend_from=source, **EXTEND), gen.card)
    return kv_cache_bytes(gen.engine.instance, request)


def test_cancelled_extension_and_deleted_session_free_every_byte(far):
    caches = far.engine.caches
    source = far.generate("a red fox runs over snow", **SOURCE)
    held = caches.bytes_in_use
    assert held > 0 and caches.session_stats()["sessions"] == 1
    token = CancellationToken()
    pinned: list[int] = []

    def stop_after_first_step(event: Any) -> None:
        if isinstance(event, ProgressEvent) and event.phase == "rollout":
            pinned.append(caches.session_stats()["pinned"])  # in use by the extension: not evictable
            token.cancel()

    with pytest.raises(Cancelled):
        far.generate("a cat", extend_from=source, on_event=stop_after_first_step, cancel=token, **EXTEND)
    assert pinned == [1] and caches.session_stats()["pinned"] == 0
    assert caches.bytes_in_use == held  # the extension's slab and its pin are gone; the source's session stays
    assert far.release_session(source.session.session_id)
    assert caches.bytes_in_use == 0 and caches.stats()["handles"] == 0


def test_sessions_off_keeps_nothing_and_still_extends(far_dir):
    far = VideoGenerator.from_pretrained(far_dir, device="cpu")
    seen: list[str] = []
    source = far.generate("a red fox", on_event=lambda e: seen.append(getattr(e, "phase", "")), **SOURCE)
    assert SESSION not in seen and far.engine.caches.bytes_in_use == 0
    out = far.generate("a cat", extend_from=source, **EXTEND)
    assert out.metadata["extension"]["kv"] == "rebuilt" and far.engine.caches.bytes_in_use == 0


def test_rss_stays_flat_over_repeated_sessions(far):
    """4 source + extension runs, each session deleted: RSS after the warmup runs grows by < 24 MiB."""
    caches = far.engine.caches

    def cycle(i: int) -> None:
        source = far.generate("a red fox", **{**SOURCE, "seed": i})
        out = far.generate("a cat", extend_from=source, **EXTEND)
        for session_id in (source.session.session_id, out.session.session_id):
            caches.release_session(session_id)
        assert caches.bytes_in_use == 0

    for i in range(2):
        cycle(i)
    gc.collect()
    start = _rss()
    for i in range(2, 6):
        cycle(i)
    gc.collect()
    # Headroom for allocator/arena noise; a leaked session or slab per run would be visible in the accounting above.
    assert _rss() - start < 24 * 2**20


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_extend_from_is_validated_at_the_boundary(far, far_dir, tmp_path):
    source = far.generate("a red fox", **SOURCE)
    cases = [
        (dict(extend_from="video_123"), "extend_from", "must be a finished causal video"),
        (dict(extend_from=source, height=48), "height", "source video's is 32"),
        (dict(extend_from=source, num_frames=9), "num_frames", "all taken by the source"),
        (dict(extend_from=source, guidance_scale=3.0), "guidance_scale", "whether CFG runs"),
        (dict(extend_from=source, image=np.zeros((32, 48, 3), np.uint8)), "image", "cannot be combined"),
    ]
    for kwargs, field, message in cases:
        with pytest.raises(InvalidRequest, match=message) as err:
            far.generate("a cat", **{"num_inference_steps": 1, **kwargs})
        assert err.value.field == field
    other = VideoGenerator.from_pretrained(write_tiny_far(tmp_path / "b", FAR_B), device="cpu")
    with pytest.raises(InvalidRequest, match="made by another model") as err:
        other.generate("a cat", extend_from=source, num_inference_steps=1)
    assert err.value.field == "extend_from"
    # A default-length extension adds a default video's worth of frames after the source's.
    resolved = far.engine.submit(GenerationRequest(prompt="a cat", extend_from=source)).request
    assert resolved.num_frames == 9 + far.card.sampling_defaults.num_frames - 1 and resolved.height == 32
    far.engine.caches.release_session(source.session.session_id)


def test_non_causal_models_refuse_extend_from(demo_cache):
    wan = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache)
    with pytest.raises(InvalidRequest, match="not a chunked video model") as err:
        wan.generate("a cat", extend_from=object(), num_inference_steps=1)
    assert err.value.field == "extend_from"


def test_memory_estimate_counts_the_session_copy_exactly(far, far_dir):
    from vidloom.media.request_inputs import resolve_request
    from vidloom.families.wan_causal.memory import session_bytes

    source = far.generate("a red fox", **SOURCE)
    kept = far.engine.caches.session_stats()["session_bytes"]
    request = resolve_request(GenerationRequest(prompt="a red fox", **SOURCE), far.card)
    assert session_bytes(far.engine.instance, request) == kept > 0
    off = VideoGenerator.from_pretrained(far_dir, device="cpu")
    assert session_bytes(off.engine.instance, request) == 0
    far.engine.caches.release_session(source.session.session_id)


def test_the_first_new_chunk_attends_to_the_source(far):
    """Same extension request over two sources: the first new chunk's latents differ only through the source KV."""
    first_new = slice(3, 5)  # source partition (1, 2): the extension's first chunk is latent frames 3..4
    sources = [far.generate("a red fox", **{**SOURCE, "seed": seed}) for seed in (1, 2)]
    chunks = [_extend(far, source)["session"]["latents"][:, :, first_new] for source in sources]
    assert not torch.allclose(chunks[0], chunks[1], atol=1e-3)
    # Chained: an extension is itself a source; its session holds the whole longer video.
    longer = far.generate("a cat", extend_from=sources[0], **EXTEND)
    again = far.generate("a bird", extend_from=longer, num_frames=29, num_inference_steps=2, seed=3)
    assert again.metadata["extension"]["kv"] == "resident" and again.session.partition == (1, 2, 2, 1, 2)
    assert np.array_equal(again.frames[:21], longer.frames)
