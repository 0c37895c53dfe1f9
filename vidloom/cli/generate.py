"""`vidloom generate`: check everything the user typed, load, generate with progress, write the file."""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from vidloom import registry
from vidloom.cli.actions import ACTION_FLAGS, action_block
from vidloom.cli.interrupt import EXIT_INTERRUPTED, InterruptGuard, say
from vidloom.cli.options import option_values
from vidloom.cli.output_files import write_files
from vidloom.cli.phases import PhaseClock
from vidloom.cli.progress import ProgressBars, cancelled_line
from vidloom.cli.uptime import process_seconds
from vidloom.core.deploy import DeployConfig
from vidloom.core.card import ModelCard
from vidloom.core.errors import Cancelled, InvalidRequest, counted
from vidloom.core.request import GenerationRequest, Task
from vidloom.loading.quiet import LIBRARIES, LOUDER_THAN_ERRORS
from vidloom.media.request_inputs import resolve_request
from vidloom.cli.deploy_args import deploy_config

# GenerationRequest / setting field -> the flag a CLI user typed, so errors name what they can change (the option
# blocks' flags: cli/options.option_flags).
FLAG_OF_FIELD: dict[str, str] = {
    "prompt": "--prompt", "negative_prompt": "--negative-prompt", "height": "--height", "width": "--width",
    "num_frames": "--frames", "fps": "--fps", "num_inference_steps": "--steps", "guidance_scale": "--guidance",
    "flow_shift": "--shift", "sampler": "--sampler", "seed": "--seed",
    "step_cache_threshold": "--step-cache-threshold", "output": "--output", "model": "--model",
    "device": "--device", "dtype": "--dtype", "data_dir": "--data-dir", "image": "--image", "video": "--video",
    "last_image": "--last-image", "audio_out": "--audio-out", "lora": "--lora", "loras": "--lora",
    "fuse_loras": "--fuse-loras", "init_audio": "--init-audio", **ACTION_FLAGS,
}


def flag_of(field: str) -> str | None:
    """The flag a CLI user typed for a request or setting field (an option's from its block), if any."""
    from vidloom.cli.options import option_flags

    return FLAG_OF_FIELD.get(field) or option_flags().get(field)


def generate_command(args: argparse.Namespace, torchrun_place: Callable[[], Any],
                     follow: Callable[[str, argparse.Namespace, DeployConfig], int], guard: InterruptGuard) -> int:
    """Check, load, generate, write; every phase boundary honours a Ctrl-C (see cli/interrupt.py)."""
    clock = PhaseClock()
    quiet_third_party(args.verbose, libraries=False)  # transformers (0.6 s to import) after the checks: see below
    place = torchrun_place()
    deploy = deploy_config(args, place.world_size if place else None)  # a bad plan fails here, before any process starts
    if place is not None and place.rank != 0:
        quiet_third_party(args.verbose)
        return follow(args.model, args, deploy)
    from vidloom.generator import build_request
    from vidloom.media.output import check_output_frames, check_output_path

    card = registry.resolve_card(args.model)
    output = Path(args.output or _default_output(card))
    if card.audio is not None:  # audio only: the file is the waveform
        from vidloom.media.audio_files import AUDIO_FILE_FORMATS

        check_output_path(output, formats=AUDIO_FILE_FORMATS)
        if args.audio_out is not None:
            raise InvalidRequest("audio_out", f"{card.model_id} makes audio only; --output is the audio file")
    else:
        check_output_path(output)
    wav = args.audio_out
    if args.sound and wav is None and output.suffix.lower() in (".mp4", ".webm"):
        wav = str(output.with_suffix(".wav"))  # --sound: the soundtrack also as a wav next to the video
    audio_out = check_audio_paths(card, output, wav)
    loras = lora_flags(card, args.lora or [])
    action = action_block(args)
    request = resolve_request(build_request(
        card, args.prompt, negative_prompt=args.negative_prompt, height=args.height,
        width=args.width, num_frames=args.frames, fps=args.fps, num_inference_steps=args.steps,
        guidance_scale=args.guidance, flow_shift=args.shift, sampler=args.sampler, seed=args.seed,
        image=_one_or_list(args.image), last_image=args.last_image, video=args.video, init_audio=args.init_audio,
        loras={name: scale for name, (_, scale) in loras.items()}, **option_values(args), action=action,
    ), card)
    check_output_frames(output, request.num_frames)  # a .jpg of 81 frames fails now, not after making them
    check_device(args.device)
    guard.check()  # the imports above take seconds: a Ctrl-C there that something swallowed stops here
    for note in (*card.notes, *given_field_notes(card, args)):
        say(f"note: {note}")
    clock.mark("checks")
    quiet_third_party(args.verbose)  # the load imports transformers anyway; a bad request failed before it
    clock.mark("libraries")
    return _load_and_run(args, deploy, request, output, guard, clock, audio_out, loras)


def given_field_notes(card: ModelCard, args: argparse.Namespace) -> list[str]:
    """The card's caveats about request fields the command line sets ("--guidance: has no effect: ...")."""
    notes = []
    for name, caveat in card.field_notes:
        flag = FLAG_OF_FIELD.get(name, f"--{name.replace('_', '-')}")
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) is not None:
            notes.append(f"{flag}: {caveat}")
    return notes


def _default_output(card: ModelCard) -> str:
    if card.audio is not None:
        return "out.wav"
    return "out.mp4" if Task.T2I not in card.tasks else "out.png"


def lora_flags(card: ModelCard, flags: list[str]) -> dict[str, tuple[Path, float]]:
    """--lora PATH[:SCALE] values as {adapter name (the file's stem): (path, scale)}, checked before any load."""
    from vidloom.lora.files import split_scale
    from vidloom.lora.registry import check_family

    if flags:
        check_family(card.family, "lora")
    loras: dict[str, tuple[Path, float]] = {}
    for flag in flags:
        path, scale = split_scale(flag, "lora")
        if not path.is_file():
            raise InvalidRequest("lora", f"{path}: no such LoRA file")
        name = path.stem
        while name in loras:  # two files with one stem: each keeps its own adapter
            name += "_"
        loras[name] = (path, scale)
    return loras


def check_audio_paths(card: ModelCard, output: Path, audio_out: str | None) -> Path | None:
    """--audio-out's path (a writable .wav), and neither it nor a .wav --output for a model without sound;
    before anything loads. Returns the --audio-out path, if any."""
    from vidloom.media.output import AUDIO_ONLY_FORMATS, check_output_path

    if card.audio is not None:
        return None  # audio only: --output is the waveform (checked by the caller)
    silent = f"{card.model_id} makes no sound (its outputs have no audio)"
    if output.suffix.lower() == ".wav" and not card.produces_audio:
        raise InvalidRequest("output", f"{output.name}: {silent}; write the video as .mp4")
    if audio_out is None:
        return None
    path = Path(audio_out)
    check_output_path(path, "audio_out", AUDIO_ONLY_FORMATS)
    if not card.produces_audio:
        raise InvalidRequest("audio_out", f"{silent}; drop --audio-out")
    if path.resolve() == output.resolve():
        raise InvalidRequest("audio_out", f"{path} is also the --output file; give the audio its own name")
    return path


def _load_and_run(args: argparse.Namespace, deploy: DeployConfig, request: GenerationRequest, output: Path,
                  guard: InterruptGuard, clock: PhaseClock, audio_out: Path | None = None,
                  loras: dict[str, tuple[Path, float]] | None = None) -> int:
    from vidloom.generator import VideoGenerator, accepted_keys_note
    from vidloom.media.audio import track_of
    from vidloom.media.output import SOUND_FORMATS
    from vidloom.runtime.engine import CancellationToken

    started = time.perf_counter()
    loras = loras or {}
    fuse = bool(getattr(args, "fuse_loras", False))
    if fuse and not loras:
        raise InvalidRequest("fuse_loras", "--fuse-loras needs the adapters to fuse (--lora PATH[:SCALE])")
    # Fused: the adapters go into the weights at load; the request still names them (the fused set at its scales).
    with VideoGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype, deploy=deploy,
                                        max_loras=None if fuse else len(loras) or None,
                                        fuse_loras=dict(loras) if fuse else None) as generator:
        load_s = time.perf_counter() - started
        clock.split("load", generator.load_seconds)
        accepted = generator.accepted_config_keys  # the card's own notes were printed before the load
        for line in accepted if args.verbose else accepted_keys_note(accepted):
            say(f"note: {line}")
        for name, (path, _) in loras.items() if not fuse else ():
            generator.load_lora(name, path)
        guard.check()
        bars = ProgressBars()
        token = CancellationToken()
        try:
            with bars, guard.cancels(token):
                video = generator.run(request, on_event=bars, cancel=token)
        except Cancelled:
            return _report_cancelled(guard, cancelled_line(bars))
    if token.cancelled:  # Ctrl-C after the last step boundary (during decode): still write nothing
        return _report_cancelled(guard, cancelled_line(bars))
    clock.mark("generation")
    guard.check()
    # --actions-out: a world model's predicted actions
    actions_out = Path(args.actions_out) if args.actions_out is not None and video.actions is not None else None
    try:
        written = write_files(video, output, audio_out, actions_out, guard.settle)
    except KeyboardInterrupt:  # during the writes: they removed what they had put in place
        written = None
    if written is None:
        return _report_cancelled(guard, "cancelled while writing the output (nothing kept)")
    clock.mark("write")
    paths, actions = (written[:-1], written[-1:]) if actions_out is not None else (written, [])
    track = track_of(video.audio, video.sample_rate)
    meta = video.metadata
    videos = paths[1:] if audio_out is not None else paths
    shown = str(videos[0].resolve()) if len(videos) == 1 else f"{videos[0].resolve()} .. {videos[-1].name}"
    sound = f", {track.samples.shape[0]}-channel audio @ {track.sample_rate} Hz" if track else ""
    audio_only = "seconds" in meta
    if audio_only:
        print(f"wrote {shown}  ({video.duration_s:.3f}s{sound}, seed {meta['seed']}, "
              f"{meta['sampler']} x{meta['num_inference_steps']})")
    else:
        print(f"wrote {shown}  ({picture_summary(meta, output, len(video.frames))}{sound}, seed {meta['seed']}, "
              f"{meta['sampler']} x{meta['num_inference_steps']})")
    if audio_out is not None:
        print(f"wrote {audio_out.resolve()}  (audio, {video.duration_s:.3f}s)")
    elif track is not None and not audio_only and output.suffix.lower() not in SOUND_FORMATS:
        say(f"note: {output.suffix} carries no sound; add --audio-out FILE.wav to keep it")
    for path in actions:
        print(f"wrote {path.resolve()}  (actions {video.actions.shape[0]}x{video.actions.shape[1]} float32)")
    print(f"wall time {process_seconds():.1f}s from process start (load {load_s:.1f}s, generation "
          f"{meta['elapsed_s']:.1f}s), peak memory {_peak_memory()}")
    if args.timings:
        sys.stdout.flush()  # the table comes after the summary when both streams go to one terminal
        clock.print()
    return 0


def picture_summary(meta: dict[str, Any], output: Path, frames: int) -> str:
    """"image 64x64" for one frame in an image file, else "17 frames 96x64 @ 16 fps". `frames`: those written,
    which a program may have trimmed from the request's num_frames (SANA-WM's refiner drops its sink frame)."""
    from vidloom.media.output import STILL_FORMATS

    size = f"{meta['width']}x{meta['height']}"
    if frames == 1 and output.suffix.lower() in (*STILL_FORMATS, ".png"):
        return f"image {size}"
    return f"{counted(frames, 'frame')} {size} @ {meta['fps']} fps"


def _report_cancelled(guard: InterruptGuard, line: str) -> int:
    guard.settle()  # first: a Ctrl-C while the line prints cannot add a second line
    print(line, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _one_or_list(paths: list[str] | None) -> str | list[str] | None:
    """--image once is one image (an I2V first frame); repeated, a list (reference images)."""
    return paths[0] if paths and len(paths) == 1 else paths


def check_device(device: str | None) -> None:
    """A device string torch understands and that exists here, before any weights load."""
    from vidloom.placement import resolve_device

    resolve_device(device)


def quiet_third_party(verbose: bool, libraries: bool = True) -> None:
    """Hide transformers/diffusers loading bars and info logs (ours stay); --verbose shows them.

    Hugging Face Hub download bars stay on: a multi-GB download without progress looks hung.
    `libraries=False` sets only the warning format and the verbosity variables, which transformers reads when
    it is imported: its progress-bar switch needs the import itself, which `generate` makes after its checks.
    """
    warnings.showwarning = _one_line_warning
    if verbose:  # at least warnings, whatever the environment said: VideoGenerator's quiet_loading backs off
        for variable in LIBRARIES.values():
            if os.environ.get(variable, "").lower() not in LOUDER_THAN_ERRORS:
                os.environ[variable] = "warning"
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    if not libraries:
        return
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    from huggingface_hub.utils import enable_progress_bars

    enable_progress_bars()  # transformers' switch also turned off the Hub's download bars: those stay
    # diffusers (seconds to import) only where a command already uses it; the adapter family's load, the one
    # that imports it, quiets its bars itself (loading.quiet.quiet_loading)
    if sys.modules.get("diffusers") is not None:
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
        diffusers_logging.set_verbosity_error()


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _peak_memory() -> str:
    import torch

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    text = f"{rss_mib:.0f} MiB RSS"
    if torch.cuda.is_available() and torch.cuda.max_memory_allocated() > 0:
        text += f", {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB CUDA"
    return text
