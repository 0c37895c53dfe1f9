"""Cards for HunyuanVideo-1.5 diffusers folders (HunyuanVideo15Pipeline: text to video;
HunyuanVideo15ImageToVideoPipeline: image to video)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.config_keys import check_class_name
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.hunyuan15.schedule import Hunyuan15Guider, Hunyuan15Schedule
from vidloom.families.hunyuan15.sizes import DEFAULT_ASPECT, closest_bucket
from vidloom.families.hunyuan15.text import MAX_PROMPT_TOKENS

FAMILY = "hunyuan15"
PIPELINE_CLASS = "HunyuanVideo15Pipeline"
I2V_PIPELINE_CLASS = "HunyuanVideo15ImageToVideoPipeline"
PROGRAM = "vidloom.families.hunyuan15.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.hunyuan15.memory:request_estimator"
VAE_CLASS_NAME = "AutoencoderKLHunyuanVideo15"
# HunyuanVideo15Pipeline.__init__'s components.
INDEX_COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler", "text_encoder_2", "tokenizer_2",
                    "guider")
I2V_COMPONENTS = (*INDEX_COMPONENTS, "image_encoder", "feature_extractor")  # + SigLIP and its processor
# The common fields its program reads (guidance_scale: the guider's unless the request gives one), and fps: the
# written video's frame rate.
READS = frozenset({"negative_prompt", "height", "width", "num_frames", "fps", "num_inference_steps", "guidance_scale",
                   "flow_shift", "step_cache_threshold"})
I2V_READS = READS - {"height", "width"}  # image to video: the size is the first frame's aspect bucket
IMAGE_SIZE_NOTE = "with an image, its aspect bucket sets the size (the pipeline ignores height and width)"
CFG_NOTE = ("the saved guider (guider/guider_config.json) sets the default guidance_scale and the steps that run CFG; "
            "a missing negative prompt is \" \", as the pipeline encodes it")
GRAPHS_NOTE = ("--cuda-graphs: a graph per video size and set of prompt-length buckets (each CFG branch's text and "
               "glyph tokens padded to the next multiple of 64, the padding keys masked); a request whose prompts "
               "fall in buckets seen before replays")
BATCH_NOTE = ("--policy batch: requests of one video size and task (and, image to video, one image-token count) share "
              "a forward whatever their prompts' lengths (padded and masked); one running CFG at a step and one not "
              "run apart")

CAPABILITIES = Capabilities(
    frozenset({"compile", "warmup_shapes", "offload_text_encoder", "prompt_cache_size", "attention_backend",
               "fp8_weights", "step_cache", "vae_tile", "devices", "cfg_parallel", "text_encoder_rank", "batching",
               "cuda_graphs"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "two_stage", "components",
             kv_cache_budget_bytes="a video denoiser keeps no KV cache to budget",
             cfg_mode="prompt and negative prompt are encoded unpadded, so their condition tokens differ in number "
                      "and the two CFG branches run one after the other, as the guider runs them"),
)
CAPABILITY_ROWS = {"hunyuan15": CAPABILITIES}  # `vidloom models --capabilities`
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)


@dataclass(frozen=True)
class LatentGeometry:
    """The VAE's latent layout, read from its config.json without building the VAE."""

    spatial: int = 16  # spatial_compression_ratio
    temporal: int = 4  # temporal_compression_ratio
    channels: int = 32  # latent_channels
    scaling: float = 1.03682  # scaling_factor: the pipeline divides latents by it before decoding

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> LatentGeometry:
        check_class_name(cfg, (VAE_CLASS_NAME,), "VAE config")
        d = cls()
        return cls(spatial=int(cfg.get("spatial_compression_ratio", d.spatial)),
                   temporal=int(cfg.get("temporal_compression_ratio", d.temporal)),
                   channels=int(cfg.get("latent_channels", d.channels)),
                   scaling=float(cfg.get("scaling_factor", d.scaling)))


def check_pipeline(ckpt: DiffusersDir) -> None:
    """A HunyuanVideo-1.5 pipeline folder whose model_index.json holds only keys this loader reads."""
    ckpt.expect_pipeline(PIPELINE_CLASS, I2V_PIPELINE_CLASS)
    ckpt.check_index(I2V_COMPONENTS if ckpt.pipeline_class == I2V_PIPELINE_CLASS else INDEX_COMPONENTS)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for a HunyuanVideo-1.5 folder: the default size is the 16:9 bucket of the transformer's target_size
    (image to video: the first frame's bucket), the guidance scale the guider's, the shift the scheduler's."""
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    dit = ckpt.component_config("transformer")
    latent = ckpt.parse_component("vae", LatentGeometry.from_diffusers)
    schedule = ckpt.parse_component("scheduler", Hunyuan15Schedule.from_diffusers, "scheduler_config.json")
    guider = ckpt.parse_component("guider", Hunyuan15Guider.from_diffusers, "guider_config.json")
    multiple = latent.spatial * int(dit.get("patch_size", 1))
    height, width = closest_bucket(*DEFAULT_ASPECT, int(dit.get("target_size", 640)), latent.spatial)
    # HunyuanVideo15Pipeline.__call__'s defaults: 121 frames, 50 steps; the guider's scale.
    defaults = SamplingDefaults(height=height, width=width, num_frames=121, fps=24, num_inference_steps=50,
                                guidance_scale=guider.guidance_scale, flow_shift=schedule.shift, sampler="euler",
                                negative_prompt="")
    i2v = ckpt.pipeline_class == I2V_PIPELINE_CLASS
    task = "image-to-video" if i2v else "text-to-video"
    return hunyuan15_card(ckpt.root.name, str(ckpt.root), multiple=multiple, temporal=latent.temporal,
                          defaults=defaults, description=f"HunyuanVideo-1.5 {task} from {ckpt.root}", i2v=i2v)


def hunyuan15_card(model_id: str, source: str, *, multiple: int, temporal: int, defaults: SamplingDefaults,
                   description: str, notes: tuple[str, ...] = (), precision: str = "bfloat16",
                   i2v: bool | None = False) -> ModelCard:
    """The card of a HunyuanVideo-1.5 folder: sizes a multiple of `multiple` pixels, temporal x k + 1 frames;
    `i2v`: every request gives the first frame, which sets the size; None: an image to video folder that also
    runs text to video (the image optional: the demo)."""
    weightless = ("tokenizer", "tokenizer_2", "scheduler", "guider", "feature_extractor")
    image = frozenset({"image"}) if i2v is not False else frozenset()
    tasks = {False: {Task.T2V}, True: {Task.I2V}, None: {Task.T2V, Task.I2V}}[i2v]
    field_notes = () if i2v is not None else tuple((key, IMAGE_SIZE_NOTE) for key in ("height", "width"))
    return CARDS.card(
        model_id, source, {"denoise": LoopSpec(samplers=("euler",))},
        components=component_table(precision, *(I2V_COMPONENTS if image else INDEX_COMPONENTS), no_weights=weightless),
        tasks=frozenset(tasks), precision=precision, sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=temporal), description=description,
        notes=(*notes, CFG_NOTE, BATCH_NOTE, GRAPHS_NOTE), max_prompt_tokens=MAX_PROMPT_TOKENS,
        optional_fields=I2V_READS if i2v else READS,
        inputs=image, required_inputs=image if i2v else frozenset(), field_notes=field_notes,
    )
