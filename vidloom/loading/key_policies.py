"""Every reader's KeyPolicy that accepts or refuses more than it reads, by the config class it reads (lazy
"module:attribute" strings). docs/reference/config-keys.md is written from this table (docs/gen_reference.py)."""

from __future__ import annotations


from vidloom.core import plugin
from vidloom.loading.key_policy import KeyPolicy

# (config class, where its config lives) -> the policy of our reader.
KEY_POLICIES: dict[tuple[str, str], str] = {
    ("AutoencoderKLWan", "vae/config.json (Wan, Cosmos3, AnyFlow-FAR)"): "vidloom.models.wan.vae:WAN_VAE_POLICY",
    ("UniPCMultistepScheduler", "scheduler/scheduler_config.json (Wan, Cosmos3)"):
        "vidloom.diffusion.scheduler_keys:UNIPC_POLICY",
    ("FlowMatchEulerDiscreteScheduler", "scheduler/scheduler_config.json (Wan, SANA-WM)"):
        "vidloom.diffusion.scheduler_keys:EULER_POLICY",
    ("FlowMapEulerDiscreteScheduler", "scheduler/scheduler_config.json (AnyFlow-FAR)"):
        "vidloom.diffusion.scheduler_keys:FLOW_MAP_POLICY",
    ("AutoencoderKLFlux2", "vae/config.json (FLUX.2-klein)"): "vidloom.families.flux2.vae:FLUX2_VAE_POLICY",
    ("FlowMatchEulerDiscreteScheduler", "scheduler/scheduler_config.json (FLUX.2-klein)"):
        "vidloom.families.flux2.schedule:SCHEDULER_POLICY",
    ("FlowMatchEulerDiscreteScheduler", "scheduler/scheduler_config.json (LTX-2)"):
        "vidloom.families.ltx2.schedule:SCHEDULER_POLICY",
    ("HeliosScheduler", "scheduler/scheduler_config.json (Helios, Helios-Mid)"):
        "vidloom.families.helios.schedule:SCHEDULER_POLICY",
    ("HeliosDMDScheduler", "scheduler/scheduler_config.json (Helios-Distilled)"):
        "vidloom.families.helios.dmd:SCHEDULER_POLICY",
    ("AutoencoderKLLTX2Audio", "audio_vae/config.json (LTX-2)"): "vidloom.models.ltx2.audio_vae:AUDIO_VAE_POLICY",
    ("Cosmos3OmniTransformer", "transformer/config.json (Cosmos3)"):
        "vidloom.families.cosmos3.config:TRANSFORMER_POLICY",
    ("CosineDPMSolverMultistepScheduler", "scheduler/scheduler_config.json (Stable Audio Open)"):
        "vidloom.diffusion.cosine_dpm:SCHEDULER_POLICY",
    ("LTX2VideoTransformer3DModel", "transformer/config.json (LTX-2)"):
        "vidloom.models.ltx2.transformer:TRANSFORMER_POLICY",
    ("AutoencoderKLLTX2Video", "vae/config.json (LTX-2, SANA-WM)"): "vidloom.models.ltx2.video_vae:VIDEO_VAE_POLICY",
    ("LTX2TextConnectors", "connectors/config.json (LTX-2, SANA-WM refiner)"):
        "vidloom.models.ltx2.connectors:CONNECTORS_POLICY",
    ("LTX2LatentUpsamplerModel", "latent_upsampler/config.json (LTX-2)"):
        "vidloom.models.ltx2.upsampler:UPSAMPLER_POLICY",
    ("SanaWMTransformer3DModel", "transformer/config.json (SANA-WM)"):
        "vidloom.families.sana_wm.config:TRANSFORMER_POLICY",
    ("AnyFlowFARTransformer3DModel", "transformer/config.json (AnyFlow-FAR)"):
        "vidloom.families.wan_causal.config:TRANSFORMER_POLICY",
    ("Qwen2_5OmniConfig", "config.json (Qwen2.5-Omni)"): "vidloom.families.qwen_omni.config_keys:ROOT",
    ("Qwen2_5OmniThinkerConfig", "config.json thinker_config"): "vidloom.families.qwen_omni.config_keys:THINKER",
    ("Qwen2_5OmniTextConfig", "config.json thinker_config.text_config"): "vidloom.families.qwen_omni.config_keys:TEXT",
    ("Qwen2_5OmniAudioEncoderConfig", "config.json thinker_config.audio_config"):
        "vidloom.families.qwen_omni.config_keys:AUDIO",
    ("Qwen2_5OmniVisionEncoderConfig", "config.json thinker_config.vision_config"):
        "vidloom.families.qwen_omni.config_keys:VISION",
    ("Qwen2_5OmniTalkerConfig", "config.json talker_config"): "vidloom.families.qwen_omni.config_keys:TALKER",
    ("Qwen2_5OmniToken2WavConfig", "config.json token2wav_config"): "vidloom.families.qwen_omni.config_keys:TOKEN2WAV",
    ("Qwen2_5OmniDiTConfig", "config.json token2wav_config.dit_config"): "vidloom.families.qwen_omni.config_keys:DIT",
    ("Qwen2_5OmniBigVGANConfig", "config.json token2wav_config.bigvgan_config"):
        "vidloom.families.qwen_omni.config_keys:BIGVGAN",
    ("Qwen3OmniMoeConfig", "config.json (Qwen3-Omni)"): "vidloom.families.qwen3_omni.config_keys:ROOT",
    ("Qwen3OmniMoeThinkerConfig", "config.json thinker_config (Qwen3-Omni)"):
        "vidloom.families.qwen3_omni.config_keys:THINKER",
    ("Qwen3OmniMoeTextConfig", "config.json thinker_config.text_config (Qwen3-Omni)"):
        "vidloom.families.qwen3_omni.config_keys:TEXT",
    ("Qwen3OmniMoeTalkerConfig", "config.json talker_config (Qwen3-Omni)"):
        "vidloom.families.qwen3_omni.config_keys:TALKER",
    ("Qwen3OmniMoeTalkerTextConfig", "config.json talker_config.text_config (Qwen3-Omni)"):
        "vidloom.families.qwen3_omni.config_keys:TALKER_TEXT",
}


def key_policy(target: str) -> KeyPolicy:
    """The KeyPolicy a "module:attribute" string of KEY_POLICIES names."""
    policy = plugin.resolve(target)
    assert isinstance(policy, KeyPolicy), f"{target} is not a KeyPolicy"
    return policy
