"""LTX-2: cards, loading, the joint audio-video denoise loop and program (the networks are shared: vidloom.models.ltx2)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("ltx2",),
    demos={"ltx2-demo": ".demo"},
    pipelines={"LTX2Pipeline": ".cards:card_from_checkpoint",
               "LTX2ImageToVideoPipeline": ".cards:card_from_checkpoint"},
    # LTX2LoraLoaderMixin: the transformer (video and audio branches, their cross-attention) and the text
    # connectors (applied while the prompt is encoded; the prompt cache keys by the connector adapters in force).
    lora=LoRASupport(
        targets=(("transformer", "vidloom.models.ltx2.transformer:LTX2_TRANSFORMER_NAME_MAP"),
                 ("connectors", "vidloom.models.ltx2.connectors:LTX2_CONNECTORS_NAME_MAP")),
        converter=".lora:ltx2_keys",
    ),
    token_layout=".parallel:token_layout",
)
