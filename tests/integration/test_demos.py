"""A demo for every family: each *-demo is written into a fresh cache by our own modules, loaded through the
normal loader and generates offline (HF_HUB_OFFLINE=1, no diffusers needed on the user's side).

`vidloom serve cosmos3-demo` answers chat, videos and images from one server instance; the Flux2 demo runs
through the CLI as a user runs it; the FAR demo rolls out chunks and extends its own video.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import ProcessServer, wait_for_status
from tests.helpers.wav import pcm16_wav
from vidloom import registry
from vidloom.core.errors import InvalidRequest
from vidloom.families.flux2.demo import DEMO_VERSION as FLUX2_DEMO_VERSION
from vidloom.families.helios.schedule import PYRAMID, PyramidSettings
from vidloom.generator import VideoGenerator
from vidloom.media.video import read_video

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _cli(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **OFFLINE, "VIDLOOM_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "vidloom.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _png_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def test_models_prints_a_header_then_every_demo_and_known_id(tmp_path):
    proc = _cli(["models"], tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["ID", "FAMILY", "TASKS", "WHAT", "IT", "IS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(registry.CARDS)
    assert set(registry.DEMOS) <= set(rows) and {i for i in registry.CARDS if i.endswith("-demo")} == set(registry.DEMOS)
    assert rows["qwen-omni-demo"][1:3] == ["qwen-omni", "chat,speech"]
    assert rows["cosmos3-demo"][1:3] == ["cosmos3", "i2v,t2v,chat"]
    assert rows["flux2-klein-demo"][1:3] == ["flux2", "t2i"]
    assert rows["far-demo"][1] == "anyflow-far" and rows["ltx2-demo"][1] == "ltx2"
    assert rows["stable-audio-demo"][1:3] == ["stable-audio", "t2a"]
    assert not (tmp_path / "cache").exists()  # listing writes no demo


def test_every_family_has_a_demo_whose_card_says_its_output_is_noise():
    families = {registry.resolve_card(demo).family for demo in registry.DEMOS}
    assert families == set(registry.LOADERS)  # a family without a demo fails here
    for demo in registry.DEMOS:
        card = registry.resolve_card(demo)
        assert card.source == f"demo:{demo}" and card.precision == "float32"
        assert any("RANDOM weights" in note for note in card.notes), demo


def test_flux2_demo_from_a_fresh_cache_through_the_cli_generates_and_edits(tmp_path):
    cache = tmp_path / "cache"
    out = tmp_path / "image.png"
    proc = _cli(["generate", "--model", "flux2-klein-demo", "--prompt", "a red fox", "--seed", "3",
                 "--output", str(out)], cache)
    assert proc.returncode == 0, proc.stderr
    assert "noise by design" in proc.stderr
    assert _png_size(out.read_bytes()) == (64, 64)  # the card's default request
    # The edit in-process, from the folder the CLI wrote (one CLI start-up is enough to test the CLI).
    klein = VideoGenerator.from_pretrained("flux2-klein-demo", device="cpu", cache_dir=cache)
    edit = klein.generate("make the sky purple", image=out, num_inference_steps=2, seed=3)
    assert edit.frames.shape == (1, 64, 64, 3)  # size from the reference image
    plain = klein.generate("make the sky purple", height=64, width=64, num_inference_steps=2, seed=3)
    assert not np.array_equal(edit.frames, plain.frames)  # the reference image conditions the edit
    written = [f"flux2-klein-demo-v{FLUX2_DEMO_VERSION}"]
    assert [p.name for p in cache.iterdir()] == written  # written once, no staging left


def test_qwen_image_demo_through_the_cli_writes_a_png_and_its_negative_prompt_runs_true_cfg(tmp_path):
    cache = tmp_path / "cache"
    proc = _cli(["generate", "--model", "qwen-image-demo", "--seed", "3", "--output", str(tmp_path / "cat.png"),
                 "a cat"], cache)
    assert proc.returncode == 0, proc.stderr
    assert "noise by design" in proc.stderr
    assert _png_size((tmp_path / "cat.png").read_bytes()) == (64, 64)  # the card's default request
    gen = VideoGenerator.from_pretrained("qwen-image-demo", device="cpu", cache_dir=cache)
    plain = gen.generate("a cat", num_inference_steps=2, seed=3)
    guided = gen.generate("a cat", negative_prompt="blurry", num_inference_steps=2, seed=3)
    assert not np.array_equal(plain.frames, guided.frames)  # a negative prompt switches true CFG on


def test_hunyuan15_demo_through_the_cli_writes_a_video_and_its_prompt_and_image_move_it(tmp_path):
    cache = tmp_path / "cache"
    proc = _cli(["generate", "--model", "hunyuan15-demo", "--seed", "3", "--steps", "2", "--output",
                 str(tmp_path / "sign.mp4"), 'a sign that says "open"'], cache)
    assert proc.returncode == 0, proc.stderr
    assert "noise by design" in proc.stderr
    assert read_video(tmp_path / "sign.mp4")[0].shape == (9, 48, 80, 3)  # the card's default request
    gen = VideoGenerator.from_pretrained("hunyuan15-demo", device="cpu", cache_dir=cache)
    request = dict(num_frames=5, num_inference_steps=2, seed=3)
    cat, fox = (gen.generate(p, **request).frames for p in ("a cat", "a red fox"))
    assert np.abs(cat.astype(np.int16) - fox).mean() > 1.0  # the prompt moves the video
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 30, 3), dtype=np.uint8))
    i2v = gen.generate("a cat", image=image, **request).frames
    assert i2v.shape == (5, 80, 40, 3)  # the portrait image's bucket sets the size


def test_helios_pyramid_demo_denoises_each_chunk_in_three_stages_with_cfg_zero_star(tmp_path):
    gen = VideoGenerator.from_pretrained("helios-pyramid-demo", device="cpu", cache_dir=tmp_path / "cache")
    assert gen.engine.instance[PYRAMID] == PyramidSettings(enabled=True, zero_star=True)
    steps: list[int] = []
    video = gen.generate("a paper boat", num_inference_steps=3, seed=1,
                         on_event=lambda e: steps.append(e.step) if getattr(e, "phase", "") == "denoise" else None)
    assert video.frames.shape == (33, 64, 64, 3) and steps == [1, 2, 3]  # the card's default size, a step per stage
    for field, change in (("height", dict(height=96)), ("num_inference_steps", dict(num_inference_steps=2))):
        with pytest.raises(InvalidRequest) as err:  # sizes are multiples of 64; every stage takes a step
            gen.generate("a paper boat", seed=1, **change)
        assert err.value.field == field


def test_far_demo_rolls_out_chunks_and_extends_its_own_video(tmp_path):
    far = VideoGenerator.from_pretrained("far-demo", device="cpu", cache_dir=tmp_path / "cache")
    source = far.generate("a red fox runs over snow", height=32, width=32, num_frames=9, num_inference_steps=2,
                          seed=1)
    assert source.frames.shape == (9, 32, 32, 3) and source.session.partition == (1, 2)
    longer = far.generate("a fox in the snow", extend_from=source, num_frames=21, num_inference_steps=2, seed=2)
    assert longer.frames.shape == (21, 32, 32, 3)
    assert np.array_equal(longer.frames[:9], source.frames)  # the source's frames come first, unchanged
    # Five chunks with two kept at full resolution: the oldest were read as compressed far context.
    assert longer.session.partition == (1, 2, 2, 1) and far.card.model_id == "far-demo"


def test_serve_cosmos3_demo_answers_chat_videos_and_images_from_one_instance(tmp_path):
    import openai

    os.environ.update(OFFLINE)  # ProcessServer passes os.environ on
    server = ProcessServer(tmp_path / "data", tmp_path / "cache", tmp_path / "server.log", "cosmos3-demo")
    try:
        oc = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = oc.chat.completions.create(model="cosmos3-demo", messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=6, temperature=0)
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6

        images = oc.images.generate(model="cosmos3-demo", prompt="a lighthouse", size="32x32",
                                    extra_body={"num_inference_steps": 2, "seed": 5})
        assert _png_size(base64.b64decode(images.data[0].b64_json)) == (32, 32)

        with httpx.Client(base_url=server.url, timeout=60) as client:
            created = client.post("/v1/videos", json={"prompt": "a robot dances", "size": "32x32", "num_frames": 5,
                                                      "num_inference_steps": 2, "seed": 7})
            assert created.status_code == 200, created.text
            video = wait_for_status(client, created.json()["id"], {"completed", "failed"}, timeout=180)
            assert video["status"] == "completed", video
            content = client.get(f"/v1/videos/{video['id']}/content")
            assert content.status_code == 200
            (tmp_path / "out.mp4").write_bytes(content.content)
        frames, _ = read_video(tmp_path / "out.mp4")
        assert frames.shape == (5, 32, 32, 3)
    finally:
        assert server.terminate() in (0, -15)
    assert "noise by design" in (tmp_path / "server.log").read_text()


@pytest.mark.parametrize("reason", [False, True])
def test_cosmos3_demo_makes_sound_and_reasons_first(tmp_path, reason):
    gen = VideoGenerator.from_pretrained("cosmos3-demo", device="cpu", cache_dir=tmp_path / "cache")
    out = gen.generate("a drum solo", height=32, width=32, num_frames=5, num_inference_steps=2, seed=1, sound=True,
                       reason=reason)
    assert out.frames.shape == (5, 32, 32, 3)
    assert out.audio is not None and np.isfinite(out.audio).all() and np.abs(out.audio).max() > 0


def test_ltx2_demo_makes_video_with_sound_in_two_stages(tmp_path):
    from vidloom.core.deploy import DeployConfig

    gen = VideoGenerator.from_pretrained("ltx2-demo", device="cpu", cache_dir=tmp_path / "cache",
                                         deploy=DeployConfig(two_stage=True))
    phases: list[str] = []
    out = gen.generate("a robot dancing", height=64, width=64, num_frames=9, num_inference_steps=2, seed=2,
                       on_event=lambda event: phases.append(getattr(event, "phase", None)))
    assert [p for p in dict.fromkeys(phases) if p] == ["stage1", "upsample", "stage2", "decode", "audio"]
    assert out.frames.shape == (9, 128, 128, 3)  # the latent upsampler doubled the first stage's size
    assert out.audio.shape[0] == 2 and np.isfinite(out.audio).all() and np.abs(out.audio).max() > 0


def test_wan22_demo_runs_text_and_image_to_video_with_per_token_timesteps(tmp_path):
    gen = VideoGenerator.from_pretrained("wan2.2-demo", device="cpu", cache_dir=tmp_path / "cache")
    assert gen.card.family == "wan2.2"
    kw = dict(height=32, width=32, num_frames=5, num_inference_steps=2, seed=4)
    text = gen.generate("a cat", **kw)
    first = np.full((32, 32, 3), 200, dtype=np.uint8)
    image = gen.generate("a cat", image=first, **kw)
    assert text.frames.shape == image.frames.shape == (5, 32, 32, 3)
    # The first latent frame is the image's (expand_timesteps), so the first frame moves towards it.
    assert np.abs(image.frames[0].astype(int) - 200).mean() < np.abs(text.frames[0].astype(int) - 200).mean()


def _sine_wav_part(hz: float, seconds: float) -> dict:
    rate = 16000
    tone = (0.3 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate) * 32767).astype(np.int16)
    wav = pcm16_wav(tone, rate)
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}


def test_qwen_omni_demo_hears_audio_and_sees_images(tmp_path):
    """The demo's towers are real: a clip and an image widen the prompt by their tokens, and what they hold moves
    the thinker's greedy answer; a spoken answer carries the same transcript."""
    from PIL import Image

    from vidloom.families.qwen_omni.encoders import audio_output_length

    gen = VideoGenerator.from_pretrained("qwen-omni-demo", device="cpu", cache_dir=tmp_path / "cache")
    png = io.BytesIO()
    Image.new("RGB", (96, 64), (200, 120, 40)).save(png, "PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    image = {"type": "image_url", "image_url": {"url": url}}
    question = {"type": "text", "text": "what is it?"}

    def ask(*parts: dict, **kw):
        return gen.chat([{"role": "user", "content": [*parts, question]}], max_tokens=6, temperature=0.0, **kw)

    text = ask()
    low, high = ask(_sine_wav_part(220, 1.0), image), ask(_sine_wav_part(880, 1.0), image)
    # 1 s = 100 mel frames -> 25 audio tokens; 96x64 px, resized to 84x56, is 6x4 patches of 14 px -> 6 merged; plus
    # the two pairs of bos/eos markers around them.
    assert low.prompt_tokens == text.prompt_tokens + audio_output_length(100) + 6 + 4
    assert low.text != high.text  # the tone reaches the answer
    # answered aloud, the chat is led by the card's spoken system prompt: the written answer under it is the same
    spoken = ask(_sine_wav_part(220, 1.0), image, audio={"voice": "Chelsie"})
    system = {"role": "system", "content": gen.card.spoken_system_prompt}
    written = gen.chat([system, {"role": "user", "content": [_sine_wav_part(220, 1.0), image, question]}],
                       max_tokens=6, temperature=0.0)
    assert spoken.text == written.text
