"""Every family's memory estimate against the peak it measures: an upper bound, and not a loose one.

Each case runs one request in a fresh interpreter (tests/helpers/memory_probe.py) and compares the
card's estimate with the rise of the process's peak RSS during that request, on CPU in float32 with the
tiny checkpoints. Two bounds, per family:

- measured <= estimate: the estimate is what admission holds, so it must never be below the real peak;
- estimate <= FIXED_OVERHEAD + FACTOR x measured: the variable part (all but the fixed 128 MiB each request
  is charged for a production text encoder's pass and allocator slack, which tiny models do not use) is
  at most FACTOR times the measured peak. FACTOR is 6: the copy counts are rounded up (for CUDA, for glibc
  keeping freed blocks), and the measured peak of one identical request varies up to 2x between runs
  (most likely when the cyclic garbage collector frees tensors, which changes glibc's heap layout), so an
  estimate 1.3-3x the typical peak must still pass at the low end of that spread.

The sizes are chosen so that each request's measured peak is tens to hundreds of MiB, far above the
interpreter's own baseline moves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2
from tests.helpers.helios_checkpoints import TINY_A as HELIOS_A, write_tiny_helios
from tests.helpers.hunyuan15_checkpoints import write_pipeline as write_tiny_hunyuan15
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from tests.helpers.wan22_checkpoints import write_tiny_ti2v
from tests.helpers.wan_i2v_checkpoints import make_image, write_tiny_wan_i2v
from vidloom.core.footprint import FIXED_OVERHEAD

FACTOR = 6
ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _probe(spec: dict) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.helpers.memory_probe", json.dumps(spec)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory, demo_cache) -> dict[str, dict]:
    """Probe specs by case name: where the model is and what to load it with."""
    from tests.helpers.cosmos3_sound_checkpoints import write_tiny_cosmos3_sound
    from tests.helpers.qwen3_omni_checkpoints import TALKER_A as Q3_TALKER, THINKER_A as Q3_THINKER, write_tiny_thinker
    from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni

    root = tmp_path_factory.mktemp("memory-estimates")
    ltx2 = write_tiny_ltx2(root / "ltx2", LTX2_CONFIGS[0], upsampler=True)
    omni = write_tiny_omni(root / "omni", OMNI_A)
    qwen3_omni = write_tiny_thinker(root / "qwen3-omni", Q3_THINKER, talker=Q3_TALKER)
    omni_media = _wide_processors(write_tiny_omni(root / "omni-media", OMNI_A))
    image = root / "first-frame.png"
    make_image(128, 128, seed=0).save(image)
    return {
        "wan-i2v": {"model": str(write_tiny_wan_i2v(root / "wan-i2v")), "image": str(image)},
        "wan2.2-ti2v": {"model": str(write_tiny_ti2v(root / "wan22"))},
        "wan": {"model": "wan2.1-demo", "cache_dir": str(demo_cache)},
        "far": {"model": str(write_tiny_far(root / "far", FAR_A))},
        "flux2": {"model": str(write_tiny_flux2(root / "flux2", TINY_BASE))},
        "qwen-image": {"model": str(write_qwen_image_wide(root / "qwen-image"))},
        "helios": {"model": str(write_tiny_helios(root / "helios", HELIOS_A))},
        "helios-tiled": {"model": str(root / "helios"), "deploy": {"vae_tile": 128, "vae_tile_stride": 96}},
        "hunyuan15": {"model": str(_written(write_tiny_hunyuan15, root / "hunyuan15", "p1"))},
        "ltx2": {"model": str(ltx2)},
        "ltx2-two-stage": {"model": str(ltx2), "deploy": {"two_stage": True}},
        "cosmos3-sound": {"model": str(write_tiny_cosmos3_sound(root / "cosmos3"))},
        "sana-wm": {"model": "sana-wm-demo", "cache_dir": str(demo_cache), "image": str(image)},
        "qwen-omni": {"model": str(omni), "speech": True},
        "qwen-omni-streamed": {"model": str(omni), "speech": True},
        "qwen-omni-chat-media": {"model": str(omni_media), "chat": True},
        "qwen3-omni": {"model": str(qwen3_omni), "speech": True},
        "qwen3-omni-streamed": {"model": str(qwen3_omni), "speech": True},
    }


def _written(write, folder: Path, *args) -> Path:
    """`folder` once `write(folder, *args)` (a writer that returns the pipeline) saved into it."""
    write(folder, *args)
    return folder


def _wide_processors(folder: Path) -> Path:
    """The tiny checkpoint with the released processors' reach (30 s clips, large images): parts whose towers'
    pass and processing are tens of MiB."""
    path = folder / "preprocessor_config.json"
    raw = json.loads(path.read_text())
    raw["size"]["longest_edge"] = 560 * 560
    raw.update(chunk_length=30, n_samples=30 * raw["sampling_rate"], nb_max_frames=3000)
    path.write_text(json.dumps(raw))
    return folder


# case -> (warm-up request, measured request)
CASES = {
    "wan": ({"height": 64, "width": 64, "num_frames": 5, "num_inference_steps": 1},
            {"height": 512, "width": 512, "num_frames": 1, "num_inference_steps": 1}),
    "wan-i2v": ({"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1},
                {"height": 256, "width": 256, "num_frames": 9, "num_inference_steps": 1}),
    "wan2.2-ti2v": ({"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1},
                    {"height": 256, "width": 256, "num_frames": 9, "num_inference_steps": 1}),
    "far": ({"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1},
            {"height": 128, "width": 128, "num_frames": 17, "num_inference_steps": 1}),
    "flux2": ({"height": 64, "width": 64, "num_inference_steps": 1},
              {"height": 512, "width": 512, "num_inference_steps": 1}),
    # two steps: a one-step run of this random checkpoint ends in non-finite latents (NonFiniteOutput)
    "qwen-image": ({"height": 64, "width": 64, "num_inference_steps": 2},
                   {"height": 256, "width": 256, "num_inference_steps": 2}),
    "helios": ({"height": 32, "width": 32, "num_frames": 33, "num_inference_steps": 1},
               {"height": 256, "width": 256, "num_frames": 33, "num_inference_steps": 1}),
    # the chunk decoded in 128-pixel tiles: the estimate charges one tile's decode (each tile blends into the output
    # as it finishes, layers.tiling) and the output
    "helios-tiled": ({"height": 32, "width": 32, "num_frames": 33, "num_inference_steps": 1},
                     {"height": 256, "width": 256, "num_frames": 33, "num_inference_steps": 1}),
    "hunyuan15": ({"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1},
                  {"height": 256, "width": 256, "num_frames": 17, "num_inference_steps": 1}),
    "ltx2": ({"height": 64, "width": 64, "num_frames": 9, "num_inference_steps": 2},
             {"height": 256, "width": 256, "num_frames": 49, "num_inference_steps": 2}),
    "ltx2-two-stage": ({"height": 64, "width": 64, "num_frames": 9, "num_inference_steps": 2},
                       {"height": 256, "width": 256, "num_frames": 17, "num_inference_steps": 2}),
    "cosmos3-sound": ({"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1, "sound": True},
                      {"height": 256, "width": 256, "num_frames": 17, "num_inference_steps": 1, "sound": True}),
    "sana-wm": ({"height": 64, "width": 64, "num_frames": 9, "num_inference_steps": 1, "camera": "w-8",
                 "intrinsics": [100, 100, 64, 64]},
                {"height": 256, "width": 384, "num_frames": 33, "num_inference_steps": 1, "camera": "w-16,jw-16",
                 "intrinsics": [100, 100, 64, 64]}),
    # speech (SpeechRequest fields; the talker speaks its whole budget): whole, then in streamed windows
    "qwen-omni": ({"text": "hi there", "max_audio_tokens": 40},
                  {"text": "the kite rose over the dunes", "max_audio_tokens": 1000}),
    "qwen-omni-streamed": ({"text": "hi there", "max_audio_tokens": 40, "audio_chunk_codes": 25},
                           {"text": "the kite rose over the dunes", "max_audio_tokens": 1000, "audio_chunk_codes": 25}),
    # Qwen3-Omni: a long forced text (the thinker's prefill and the talker's inputs) and 1000 frames
    "qwen3-omni": ({"text": "hi there", "max_audio_tokens": 40},
                   {"text": "the kite rose over the dunes " * 60, "max_audio_tokens": 1000}),
    "qwen3-omni-streamed": ({"text": "hi there", "max_audio_tokens": 40, "audio_chunk_codes": 25},
                            {"text": "the kite rose over the dunes " * 60, "max_audio_tokens": 1000,
                             "audio_chunk_codes": 25}),
    # a text answer to a chat with a 560x560 image and a 30 s clip: the towers' pass and the processors' work
    "qwen-omni-chat-media": ({"image": [64, 64], "audio_s": 1, "max_tokens": 2},
                             {"image": [560, 560], "audio_s": 30, "max_tokens": 4}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_bounds_the_measured_peak_within_the_factor(models, case):
    warm, request = CASES[case]
    spec = dict(models[case])
    image = spec.pop("image", None)  # an I2V model's first frame, in both requests
    if image is not None:
        warm, request = {**warm, "image": image}, {**request, "image": image}
    result = _probe({**spec, "warm": warm, "request": request})
    measured, estimate = result["measured"], result["estimate"]
    print(f"{case}: measured {measured / MiB:.1f} MiB, estimate {estimate / MiB:.1f} MiB")
    assert measured <= estimate, f"{case}: the estimate ({estimate / MiB:.1f} MiB) is below the measured peak " \
                                 f"({measured / MiB:.1f} MiB)"
    assert estimate <= FIXED_OVERHEAD + FACTOR * measured, \
        f"{case}: the estimate ({estimate / MiB:.1f} MiB) is more than {FACTOR}x the measured {measured / MiB:.1f} MiB"


def _resolved(generator, **fields):
    from vidloom.core.request import GenerationRequest, Task
    from vidloom.media.request_inputs import resolve_request

    card = generator.engine.instance.card
    return resolve_request(GenerationRequest("a red fox", task=Task.T2V, seed=0, **fields), card)


def test_cosmos3_parts_follow_sound_reasoning_and_guidance(models):
    from vidloom.generator import VideoGenerator
    from vidloom.families.cosmos3.memory import footprint, kv_bytes
    from vidloom.families.cosmos3.reason import REASON_MAX_TOKENS

    generator = VideoGenerator.from_pretrained(models["cosmos3-sound"]["model"], device="cpu")
    instance = generator.engine.instance
    size = {"height": 64, "width": 64, "num_frames": 9}
    plain = footprint(instance, _resolved(generator, guidance_scale=1.0, **size))
    sound = footprint(instance, _resolved(generator, guidance_scale=1.0, sound=True, **size))
    reason = footprint(instance, _resolved(generator, guidance_scale=1.0, reason=True, **size))
    guided = footprint(instance, _resolved(generator, guidance_scale=4.0, **size))
    assert sound.denoise > plain.denoise and sound.persistent > plain.persistent  # sound tokens, the waveform
    assert reason.caches - plain.caches == kv_bytes(instance, REASON_MAX_TOKENS)  # the prefix holds what it wrote
    assert guided.caches > plain.caches and guided.denoise == 2 * plain.denoise  # a second branch
    assert generator.engine.estimator(_resolved(generator, **size)) == footprint(
        instance, _resolved(generator, **size)).total


def test_ltx2_second_stage_raises_the_estimate(models):
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator
    from vidloom.families.ltx2.memory import footprint

    folder = models["ltx2"]["model"]
    one = VideoGenerator.from_pretrained(folder, device="cpu")
    two = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(two_stage=True))
    size = {"height": 64, "width": 64, "num_frames": 9}
    single, double = (footprint(g.engine.instance, _resolved(g, **size)) for g in (one, two))
    assert double.denoise > single.denoise  # stage 2 at the upsampled size
    assert double.persistent > single.persistent  # frames decoded at the upsampled size
