"""Which keys each part of a Qwen3-Omni config.json may hold (transformers 5.25 `Qwen3OmniMoe*Config`).

Keys config.py reads are `read` (the talker's spatial_merge_size and position_id_per_seconds place an image's
and a video's rows in its prompt; code2wav_config, audio_config and vision_config: transformers' config classes
read them, for code2wav and the towers; the thinker's position_id_per_seconds: the towers' loader, for video
positions); keys for what this runtime does not build are accepted as harmless with the reason; any other key is
refused by name (KeyPolicy).
"""

from __future__ import annotations

from vidloom.loading.key_policy import Refusal
from vidloom.loading.transformers_keys import SPECIAL_ID, transformers_policy

ROOT = transformers_policy({"thinker_config", "talker_config", "enable_audio_output", "code2wav_config"}, {
    **dict.fromkeys(("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                     "tts_eos_token_id", "system_token_id", "user_token_id", "assistant_token_id"), SPECIAL_ID),
})
_MEDIA_IDS = ("audio_token_id", "image_token_id", "video_token_id", "audio_start_token_id", "audio_end_token_id",
              "vision_start_token_id", "vision_end_token_id", "user_token_id")
THINKER = transformers_policy({"text_config", "audio_config", "vision_config", "position_id_per_seconds"}, {
    **dict.fromkeys(_MEDIA_IDS, SPECIAL_ID),
    "seconds_per_chunk": "transformers' Qwen3-Omni processor and get_rope_index interleave a video's sound track "
                         "by time position, never reading it (nor do we)",
}, head=True)
TALKER = transformers_policy({
    "text_config", "code_predictor_config", "num_code_groups", "thinker_hidden_size", "accept_hidden_layer",
    "speaker_id", "codec_eos_token_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id",
    "codec_pad_id", "codec_bos_id", "spatial_merge_size", "position_id_per_seconds"}, {
    "seconds_per_chunk": "transformers' talker get_rope_index interleaves a video's sound track by time position, "
                         "never reading it (nor do we)",
    **dict.fromkeys(("audio_token_id", "image_token_id", "video_token_id", "vision_start_token_id",
                     "audio_start_token_id", "audio_end_token_id"), SPECIAL_ID),
    "output_router_logits": "a training output (the router's auxiliary loss)",
}, head=True)
TEXT = transformers_policy({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "hidden_act",
    "attention_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers"}, {
    "attention_dropout": "a training setting: inference runs without dropout",
    "max_position_embeddings": "the trained context length; rotary positions need no table and the runtime's "
                               "token limits bound the context",
    "sliding_window": "transformers' Qwen3-Omni thinker attention never slides (it sets no window per layer)",
    "output_router_logits": "a training output (the router's auxiliary loss)",
    "router_aux_loss_coef": "a training loss weight",
}, {
    # Written by the released checkpoints' converter (Qwen3-MoE's config spelling); transformers' thinker has no
    # switch for them: it always norms q and k, never slides, and builds no shared expert.
    "use_qk_norm": Refusal((True,), "the thinker's attention always norms q and k per head"),
    "use_sliding_window": Refusal((False,), "the thinker's attention never slides"),
    "shared_expert_intermediate_size": Refusal((0,), "the thinker's MoE layers have no shared expert"),
}, head=True)
# The talker's config class names num_experts num_local_experts (its attribute_map): files hold either spelling.
_TALKER_READ = (TEXT.read - {"mlp_only_layers", "decoder_sparse_step"}) | {"shared_expert_intermediate_size",
                                                                           "num_local_experts"}
TALKER_TEXT = transformers_policy(_TALKER_READ, {
    **TEXT.harmless,
    "mlp_only_layers": "transformers' talker builds its sparse block in every layer whatever this says",
    "decoder_sparse_step": "transformers' talker builds its sparse block in every layer whatever this says",
}, {"use_qk_norm": TEXT.refused["use_qk_norm"], "use_sliding_window": TEXT.refused["use_sliding_window"]},
    head=True)
