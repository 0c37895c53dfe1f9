"""ModelCard and its parts: what a checkpoint is, what it serves, how to sample it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from vidloom.core.capabilities import Capabilities
from vidloom.core.errors import InvalidCard
from vidloom.core.request import Task
from vidloom.core.options import OptionBlock, unique_blocks

if TYPE_CHECKING:  # core.denoiser imports torch: a card is data, read by `vidloom models` without it
    from vidloom.core.denoiser import TeaCacheRescale

PRECISIONS = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ComponentSpec:
    """One loadable part of a checkpoint; its name in ModelCard.components is its diffusers subfolder,
    and loading refuses a directory that lacks any of them (naming every missing folder)."""

    dtype: str | None = None  # weights dtype on an accelerator; None = not a torch module


@dataclass(frozen=True)
class LoopSpec:
    """An iterative loop the model owns and the runtime drives step by step (its name says its kind)."""

    samplers: tuple[str, ...] = ()  # samplers this loop accepts (denoise loops)


@dataclass(frozen=True)
class RecipeSpec:
    """Provenance of the weights: where they came from and what they assume."""

    method: str  # pretrained | distilled | random-init ... (named when a request breaks the recipe's rules)
    loop: str  # the loop (name in ModelCard.loops) the weights were trained for
    # What post-training fixed, and the runtime therefore obeys (None / () = any):
    sampler: str | None = None  # the only sampler requests may use (a distilled checkpoint's, e.g. "dmd")
    timesteps: tuple[int, ...] = ()  # the step list it was distilled for; requests must ask for this many steps
    quantization: str | None = None  # "fp8": weights trained for FP8 (QAD); FP8 is switched on at load


@dataclass(frozen=True)
class SamplingDefaults:
    """Values used for request fields the caller leaves out (names match GenerationRequest)."""

    height: int
    width: int
    num_frames: int
    fps: int
    num_inference_steps: int
    guidance_scale: float
    flow_shift: float
    sampler: str
    negative_prompt: str = ""
    guidance_scale_2: float | None = None  # two-expert models: the low-noise expert's scale (None: guidance_scale)


@dataclass(frozen=True)
class Geometry:
    """Size rules a request must follow for this model."""

    spatial_multiple: int  # height/width must be divisible by this (VAE factor x patch size)
    temporal_factor: int  # frames must be temporal_factor * k + 1


@dataclass(frozen=True)
class BlockSpec:
    """An option block (core.options) a card reads, and who checks it against what.

    resolver: "module:function" (request, card) -> the request fields and options it sets (the block replaced
    by its typed form, and any size or frames it fixes), raising InvalidRequest naming the option; it must
    accept its own output (a resolved request resolves again unchanged). None: the options pass as given,
    type-checked by kind. limits: the checkpoint's sizes the resolver checks against. session: "module:Class"
    (runtime.interface.SessionHost, prompt, **fields) of the block's interactive session, if any.
    required: the block's options every request must give (the first is named when the block is left out).
    check: "module:function" (resolved request, card) -> None, for rules that read the filled request.
    """

    block: OptionBlock
    resolver: str | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    session: str | None = None
    required: tuple[str, ...] = ()
    check: str | None = None

    @property
    def name(self) -> str:
        return self.block.name


@dataclass(frozen=True)
class AudioSpec:
    """An audio-only card's duration rules: requests give seconds (and seconds_start), never frames or size."""

    max_seconds: float  # the longest clip: the model's latent window times the VAE hop, over the sample rate
    default_seconds: float  # a request without seconds
    min_start: float  # seconds_start's lower bound (the duration conditioner's min_value)
    max_end: float  # seconds_start + seconds upper bound (its max_value, and at most max_seconds: the window)
    sample_rate: int  # of the waveforms it makes, and of an initial waveform (init_audio) it takes
    min_seconds: float = 0.0  # the shortest clip (0: any length above zero), e.g. one mel frame of a vocoder
    takes_start: bool = True  # False: every clip starts at min_start and a request's seconds_start is refused

    def clip_samples(self, start: float, seconds: float) -> tuple[int, int]:
        return clip_samples(start, seconds, self.sample_rate)


def clip_samples(start: float, seconds: float, sample_rate: int) -> tuple[int, int]:
    """A clip's first and end sample in the decoded window (StableAudioPipeline truncates both to integers)."""
    return int(start * sample_rate), int((start + seconds) * sample_rate)


@dataclass(frozen=True)
class ModelCard:
    """Describes a checkpoint; validated when built."""

    model_id: str
    family: str
    components: Mapping[str, ComponentSpec]
    loops: Mapping[str, LoopSpec]
    tasks: frozenset[Task]
    precision: str  # compute dtype on an accelerator
    sampling_defaults: SamplingDefaults
    geometry: Geometry
    recipe: RecipeSpec
    program: str  # "module:function" building the Program for a loaded instance
    source: str  # checkpoint directory, or a hub repo id resolved from the local cache
    description: str = ""
    notes: tuple[str, ...] = field(default=())  # user-facing caveats (e.g. random weights)
    # (request field, caveat) pairs shown only when a request sets that field (a distilled model's guidance_scale)
    field_notes: tuple[tuple[str, str], ...] = field(default=())
    max_prompt_tokens: int | None = None  # tokens the text encoder reads (bounds prompt length); None: no text
    # "module:function" (instance) -> a MemoryEstimate (core.limits) for that instance, or None; None: unknown
    memory_estimator: str | None = None
    # Media request fields (core.request_media.MEDIA_INPUTS) this checkpoint reads: "image", "last_image",
    # "video", "init_audio"; any other given is refused naming the field.
    inputs: frozenset[str] = frozenset()
    required_inputs: frozenset[str] = frozenset()  # of `inputs`, those every request must give
    # Without height/width a request with an input image or video takes its size (floored to the size
    # multiple), as the reference pipeline does (AnyFlow-FAR, Flux2 edits); False: the card's default size.
    size_from_inputs: bool = False
    max_reference_images: int = 0  # reference images a request may pass as `image` (0: none; I2V takes one frame)
    min_image_side: int = 0  # smallest width and height of an input image, in pixels
    # Its outputs carry sound (VideoOutput.audio + sample_rate, from the program's "audio"/"sample_rate" slots);
    # `vidloom generate --audio-out` and a .wav --output are refused before loading a card without it.
    produces_audio: bool = False
    # Audio-only cards (text to audio): the seconds rules; their outputs carry audio and no frames.
    audio: AudioSpec | None = None
    # Cards with an "ar_decode" loop (chat): prompt + completion tokens one sequence may hold (max_model_len).
    context_window: int | None = None
    # The runtime features (deploy options) this checkpoint's loader, program and runtime honour; the load
    # refuses any other one a deployment turns on, naming it (core.capabilities). Declares nothing: supports nothing.
    capabilities: Capabilities = Capabilities(frozenset())
    # The common GenerationRequest fields (core.request_blocks.OPTIONAL_FIELDS: size, steps, guidance...) this
    # checkpoint's program reads; a request that sets any other one is refused naming it. None: all of them
    # (native families). Not a request block: it adds no option and has nothing to resolve, it narrows the common
    # fields for a program that cannot read them all (an adapted pipeline whose __call__ lacks some).
    optional_fields: frozenset[str] | None = None
    # The option blocks this checkpoint reads (core.options: a camera, an action, a video to extend, an audio
    # length), given as BlockSpecs and kept by block name in the order given (the order they resolve in); a
    # request with an option no block declares is refused naming it. Its CLI flags and HTTP fields come from here.
    request_blocks: Mapping[str, BlockSpec] = field(default_factory=dict)
    # "module:function" (engine, validated SpeechRequest) -> (run slots, estimated bytes) of the engine's run of
    # the program that speaks it (thinker -> talker -> vocoder); None: the model has no voice (`speak` and
    # /v1/audio/speech refuse it, naming `model`).
    speech: str | None = None
    # The system turn a spoken reply is generated under when the conversation has no system message of its own
    # (both Qwen-Omni model cards: audio output needs their documented prompt); a request's own system message
    # replaces it. None: the chat template's default. Read by the family's `speech` plug.
    spoken_system_prompt: str | None = None
    # TeaCache's calibrated indicator for this checkpoint (its family's recipe knows the published fits);
    # None: TeaCache measures block 0's modulated input with raw relative L1 (runtime.step_cache).
    teacache: TeaCacheRescale | None = None
    # Program output slots a run reports in its output's metadata under their own names, when set (not None):
    # family results the runtime passes on without knowing them (Cosmos3: the prompt its reasoner wrote).
    metadata_slots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", MappingProxyType(dict(self.components)))
        object.__setattr__(self, "loops", MappingProxyType(dict(self.loops)))
        object.__setattr__(self, "tasks", frozenset(Task(t) for t in self.tasks))
        object.__setattr__(self, "inputs", frozenset(self.inputs))
        object.__setattr__(self, "required_inputs", frozenset(self.required_inputs))
        if self.optional_fields is not None:
            object.__setattr__(self, "optional_fields", frozenset(self.optional_fields))
        specs = self.request_blocks.values() if isinstance(self.request_blocks, Mapping) else self.request_blocks
        object.__setattr__(self, "request_blocks", MappingProxyType({spec.name: spec for spec in specs}))
        self._validate()

    @property
    def option_names(self) -> tuple[str, ...]:
        """Every option this card's blocks declare."""
        return tuple(name for spec in self.request_blocks.values() for name in spec.block.names)

    @property
    def samplers(self) -> tuple[str, ...]:
        """Every sampler any loop of this card accepts."""
        return tuple(dict.fromkeys(s for loop in self.loops.values() for s in loop.samplers))

    def _validate(self) -> None:
        where = f"card {self.model_id!r}"
        if not self.model_id or not self.family:
            raise InvalidCard(f"{where}: model_id and family are required")
        chat = "ar_decode" in self.loops
        if chat and (self.context_window is None or self.context_window < 2):
            raise InvalidCard(f"{where}: an ar_decode loop needs context_window >= 2, got {self.context_window!r}")
        if not self.tasks and not chat:
            raise InvalidCard(f"{where}: serves no task and has no ar_decode loop (chat)")
        if self.precision not in PRECISIONS:
            raise InvalidCard(f"{where}: precision {self.precision!r} not in {PRECISIONS}")
        for name, spec in self.components.items():
            if spec.dtype is not None and spec.dtype not in PRECISIONS:
                raise InvalidCard(f"{where}: component {name!r} dtype {spec.dtype!r} not in {PRECISIONS}")
        if self.recipe.loop not in self.loops:
            raise InvalidCard(f"{where}: recipe assumes loop {self.recipe.loop!r}, not among {list(self.loops)}")
        if self.audio is not None and not (self.produces_audio and self.tasks == {Task.T2A}):
            raise InvalidCard(f"{where}: an audio spec needs produces_audio and tasks == {{t2a}}")
        if self.audio is not None and "seconds" not in self.option_names:
            raise InvalidCard(f"{where}: an audio spec needs the audio_length block (core.blocks.AUDIO_LENGTH)")
        if self.audio is not None and not 0 < self.audio.default_seconds <= self.audio.max_seconds:
            raise InvalidCard(f"{where}: default_seconds must be in (0, max_seconds]")
        if self.audio is not None and self.audio.max_end > self.audio.max_seconds:
            raise InvalidCard(f"{where}: max_end must not pass max_seconds (a clip is cut from the model's window)")
        if self.tasks:  # the generation defaults below describe generation requests
            self._validate_generation(where)
        if self.memory_estimator is not None and ":" not in self.memory_estimator:
            raise InvalidCard(f"{where}: memory_estimator must be 'module:function', got {self.memory_estimator!r}")
        try:
            unique_blocks(spec.block for spec in self.request_blocks.values())
        except ValueError as exc:
            raise InvalidCard(f"{where}: {exc}") from None
        for name, spec in self.request_blocks.items():
            if any(ref is not None and ":" not in ref for ref in (spec.resolver, spec.check, spec.session)):
                raise InvalidCard(f"{where}: request block {name!r} hooks must be 'module:function'")
            if not set(spec.required) <= set(spec.block.names):
                raise InvalidCard(f"{where}: request block {name!r} requires options it does not declare")
        if ":" not in self.program:
            raise InvalidCard(f"{where}: program must be 'module:function', got {self.program!r}")

    def _validate_generation(self, where: str) -> None:
        self._validate_recipe(where)
        defaults, geo = self.sampling_defaults, self.geometry
        if defaults.sampler not in self.samplers:
            raise InvalidCard(f"{where}: default sampler {defaults.sampler!r} not among {self.samplers}")
        if defaults.height % geo.spatial_multiple or defaults.width % geo.spatial_multiple:
            raise InvalidCard(f"{where}: default size not divisible by {geo.spatial_multiple}")
        if (defaults.num_frames - 1) % geo.temporal_factor:
            raise InvalidCard(f"{where}: default num_frames is not {geo.temporal_factor}k+1")
        if defaults.guidance_scale_2 is not None and "guidance_scale_2" not in self.option_names:
            raise InvalidCard(f"{where}: a default guidance_scale_2 needs the two_experts block")
        if not self.required_inputs <= self.inputs:
            raise InvalidCard(f"{where}: required_inputs {sorted(self.required_inputs - self.inputs)} not in inputs")

    def _validate_recipe(self, where: str) -> None:
        recipe, defaults = self.recipe, self.sampling_defaults
        if recipe.sampler is not None and (recipe.sampler not in self.samplers or defaults.sampler != recipe.sampler):
            raise InvalidCard(f"{where}: recipe sampler {recipe.sampler!r} must be a loop sampler and the default")
        if recipe.timesteps and defaults.num_inference_steps != len(recipe.timesteps):
            raise InvalidCard(f"{where}: default num_inference_steps is not the recipe's {len(recipe.timesteps)} steps")
        if recipe.quantization not in (None, "fp8"):
            raise InvalidCard(f"{where}: recipe quantization {recipe.quantization!r} unknown; known: fp8")
