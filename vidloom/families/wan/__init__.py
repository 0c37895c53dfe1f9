"""Wan 2.1 / 2.2 / FastWan: cards, loading, conditioning, the denoise loop and program (the networks are shared: vidloom.models.wan)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("wan2.1", "wan2.2"),
    cards={
        "wan2.1-t2v-1.3b": ".cards:wan21_t2v_1_3b",
        "wan2.1-t2v-14b": ".cards:wan21_t2v_14b",
        "wan2.1-i2v-14b-480p": ".registered:wan21_i2v_14b_480p",
        "wan2.1-i2v-14b-720p": ".registered:wan21_i2v_14b_720p",
        "wan2.1-flf2v-14b-720p": ".registered:wan21_flf2v_14b_720p",
        "wan2.2-ti2v-5b": ".registered:wan22_ti2v_5b",
        "wan2.2-t2v-a14b": ".registered:wan22_t2v_a14b",
        "wan2.2-i2v-a14b": ".registered:wan22_i2v_a14b",
        "fastwan2.1-t2v-1.3b": ".registered:fastwan21_t2v_1_3b",
        "fastwan2.1-t2v-1.3b-fp8": ".registered:fastwan21_t2v_1_3b_fp8",
        "fastwan2.2-ti2v-5b": ".registered:fastwan22_ti2v_5b",
    },
    demos={"wan2.1-demo": ".demo", "wan2.2-demo": ".demo_ti2v"},
    pipelines={
        "WanPipeline": ".cards:card_from_checkpoint",
        "WanImageToVideoPipeline": ".cards:card_from_checkpoint",
        # FastVideo's name for its DMD-distilled FastWan repos (fastvideo/registry.py): the FastWan recipe.
        "WanDMDPipeline": ".registered:fastwan_card_from_checkpoint",
    },
    # diffusers' WanLoraLoaderMixin loads into the pipeline's `transformer` unless told otherwise; a Wan2.2 A14B
    # file may go into the low-noise expert instead (load_lora_weights(load_into_transformer_2=True)).
    lora=LoRASupport(
        targets=(("transformer", "vidloom.models.wan.transformer_config:WAN_TRANSFORMER_NAME_MAP"),),
        into={"transformer_2": "transformer"},
        converter="vidloom.lora.formats:wan_keys",
    ),
    token_layout=".parallel:token_layout",
    options=("vidloom.core.blocks:VIDEO_TO_VIDEO", "vidloom.core.blocks:TWO_EXPERTS"),
)
