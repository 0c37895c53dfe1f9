"""What `vidloom generate` prints, as a new user reads it: honest wall time, audio files without a false
"no sound" note, an image called an image, caveats only about what was asked (#39). One frame in an image file called an image: test_cli_small_fixes.py's
`-o` run checks it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from vidloom import registry
from vidloom.cli import build_parser
from vidloom.cli.generate import given_field_notes

ROOT = Path(__file__).resolve().parents[2]
WALL = re.compile(r"wall time ([\d.]+)s from process start \(load ([\d.]+)s, generation ([\d.]+)s\)")


def _cli(args: list[str], cache: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VIDLOOM_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "vidloom.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    return done, time.monotonic() - started


def test_an_audio_file_gets_no_no_sound_note_and_wall_time_counts_from_process_start(tmp_path):
    out = tmp_path / "rain.flac"
    done, measured = _cli(["generate", "--model", "stable-audio-demo", "--prompt", "rain on a tin roof", "--seconds",
                           "0.25", "--steps", "2", "--seed", "1", "-o", str(out)], tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert out.is_file() and "carries no sound" not in done.stderr
    wall, load, generation = (float(v) for v in WALL.search(done.stdout).groups())
    # Start-up (interpreter, imports) is in: more than load plus generation, less than the parent saw
    # (which adds the fork and the interpreter's teardown); one decimal shown, hence the 0.1.
    assert load + generation < wall <= measured + 0.1, (wall, load, generation, measured)


def test_a_distilled_models_guidance_caveat_shows_only_when_guidance_is_given():
    card = registry.resolve_card("flux2-klein-demo")
    assert not any("guidance" in note for note in card.notes)
    plain = build_parser().parse_args(["generate", "--model", "flux2-klein-demo", "--prompt", "a fox"])
    given = build_parser().parse_args(["generate", "--model", "flux2-klein-demo", "--prompt", "a fox",
                                       "--guidance", "4"])
    assert given_field_notes(card, plain) == []
    assert given_field_notes(card, given) == ["--guidance: has no effect: step-distilled Klein runs without CFG"]


def test_the_summary_counts_the_frames_written_not_the_frames_asked():
    """SANA-WM's refiner drops its sink frame: 33 asked, 32 written, and the line says 32."""
    from vidloom.cli.generate import picture_summary

    meta = {"num_frames": 33, "width": 96, "height": 64, "fps": 16}
    assert picture_summary(meta, Path("refined.mp4"), 32) == "32 frames 96x64 @ 16 fps"
    assert picture_summary({**meta, "num_frames": 1}, Path("fox.jpg"), 1) == "image 96x64"
    assert picture_summary({**meta, "num_frames": 1}, Path("one.mp4"), 1) == "1 frame 96x64 @ 16 fps"
