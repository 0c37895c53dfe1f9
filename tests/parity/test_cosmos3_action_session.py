"""An action session equals the single calls it stands for, and frees its resident state.

Chunk k of a session is stated to be one generate call conditioned on the last frame of chunk k - 1 (the
first: the session's image), seeded seed + k (single calls are parity-tested against Cosmos3OmniPipeline in
test_cosmos3_actions.py). With kv_session_ttl_s the prompt prefixes stay resident between chunks (reused,
not recomputed) and go back to the cache manager on close, on a bad step, or when the session is dropped.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vidloom import ActionInput
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator

PROMPT = "push the block to the left"
FIELDS = dict(num_inference_steps=2, guidance_scale=3.0, seed=11)
TIER = 256


def _first() -> Image.Image:
    return Image.fromarray(np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def generator(cosmos3_action_dir: Path) -> VideoGenerator:
    return VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))


@pytest.mark.parametrize("mode", ["policy", "forward_dynamics"])
def test_a_session_equals_the_single_calls_it_stands_for(generator: VideoGenerator, mode: str):
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    block = ActionInput(mode=mode, domain_name="pusht", chunk_size=4, resolution_tier=TIER)
    drives = [np.full((4, 2), value, dtype=np.float32) for value in (0.5, -1.0, 0.25)]
    prefills: list[int] = []

    def count(event) -> None:
        prefills.append(getattr(event, "phase", None) == "prefix_prefill")

    chunks = []
    with generator.open_session(PROMPT, image=_first(), action=block, **FIELDS) as session:
        for k in range(3):
            prefills.clear()
            request = session.request(drives[k] if mode == "forward_dynamics" else None)
            output = generator.run(request, on_event=count)
            chunks.append(output)
            session._frame, session.index = Image.fromarray(output.frames[-1]), session.index + 1
            assert any(prefills) == (k == 0), "chunks after the first reuse the resident prefixes"
            assert caches.session_ids() == [session.session_id] and caches.bytes_in_use > baseline
    assert caches.bytes_in_use == baseline and not caches.session_ids()  # closed: nothing left
    frame = _first()
    for k, chunk in enumerate(chunks):
        single = generator.generate(PROMPT, image=frame, num_inference_steps=2, guidance_scale=3.0, seed=11 + k,
                                    action=ActionInput(mode=mode, domain_name="pusht", chunk_size=4,
                                                       resolution_tier=TIER,
                                                       raw_actions=drives[k] if mode == "forward_dynamics" else None))
        assert np.array_equal(chunk.frames, single.frames), f"chunk {k}"
        if mode == "policy":
            assert np.abs(chunk.actions - single.actions).max() <= 1e-6
        frame = Image.fromarray(single.frames[-1])
    assert caches.bytes_in_use == baseline


def test_step_returns_chunks_and_a_bad_step_or_a_dropped_session_frees_everything(generator: VideoGenerator):
    caches = generator.engine.caches
    baseline = caches.bytes_in_use
    session = generator.open_session(PROMPT, image=_first(), **FIELDS, action=ActionInput(
        mode="forward_dynamics", domain_name="pusht", chunk_size=4, resolution_tier=TIER))
    first = session.step(np.ones((4, 2), dtype=np.float32))
    assert first.index == 0 and first.frames.shape == (5, 48, 64, 3) and first.actions is None
    assert caches.bytes_in_use > baseline
    with pytest.raises(InvalidRequest) as exc:
        session.step(np.ones((4, 3)))  # the wrong width: refused before any work, the session stays usable
    assert exc.value.field == "action.raw_actions" and session.index == 1
    second = session.step(np.zeros((2, 2), dtype=np.float32))
    assert second.index == 1 and np.array_equal(second.frames[0].shape, first.frames[-1].shape)
    del session, exc  # a client that never closes: dropping the session (and the traceback that saw it) frees it
    gc.collect()
    assert caches.bytes_in_use == baseline and not caches.session_ids()


def test_sessions_refuse_what_they_cannot_roll_out(generator: VideoGenerator, cosmos3_dir: Path):
    with pytest.raises(InvalidRequest) as exc:
        generator.open_session(PROMPT, image=_first(), action=ActionInput(
            mode="inverse_dynamics", domain_name="pusht", chunk_size=4))
    assert exc.value.field == "action.mode"
    with pytest.raises(InvalidRequest) as exc:
        generator.open_session(PROMPT, image=_first(), action=ActionInput(
            mode="policy", domain_name="mars_rover", chunk_size=4))
    assert exc.value.field == "action.domain_name"
    plain = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    with pytest.raises(InvalidRequest) as exc:
        plain.open_session(PROMPT, image=_first(), action=ActionInput(mode="policy", domain_name="pusht"))
    assert exc.value.field == "action"
