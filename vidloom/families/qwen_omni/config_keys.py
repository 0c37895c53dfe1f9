"""Which keys each part of a Qwen2.5-Omni config.json may hold, from transformers' history.

Classified: every attribute of transformers' Qwen2_5Omni*Config classes from their first release (4.52, 2025-05;
the 7B and 3B config.json files were written by it and its previews) through 5.25, plus the PreTrainedConfig
attributes transformers 4.x wrote into every nested config. Keys the readers in config.py use are `read`; any
other key is refused by name (KeyPolicy), as the diffusers readers do.
"""

from __future__ import annotations

from vidloom.loading.key_policy import Refusal
from vidloom.loading.transformers_keys import PRETRAINED_BOOKKEEPING, TRANSFORMERS_META  # noqa: F401 (re-exported)
from vidloom.loading.transformers_keys import SPECIAL_ID as _SPECIAL_ID
from vidloom.loading.transformers_keys import transformers_policy as _policy

ROOT = _policy({"thinker_config", "talker_config", "token2wav_config", "enable_audio_output"})

_THINKER_IDS = ("audio_token_index", "image_token_index", "video_token_index", "audio_start_token_id",
                "audio_end_token_id", "user_token_id", "vision_start_token_id", "vision_end_token_id")
THINKER = _policy({"text_config", "audio_config", "vision_config"}, {
    **dict.fromkeys(_THINKER_IDS, _SPECIAL_ID),
    "seconds_per_chunk": "only interleaves the audio of a video input in chunks; this runtime takes no video",
}, {"position_id_per_seconds": Refusal((25,), "media/TMRoPE positions here advance 25 per second "
                                              "(models/omni_media.py POSITION_ID_PER_SECONDS)")})

# The decoder keys config.DecoderConfig reads; rope_theta / rope_scaling are the 4.x spelling of rope_parameters.
_DECODER_READ = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta",
                 "hidden_act", "use_sliding_window"}
_DECODER_HARMLESS = {
    "attention_dropout": "a training setting: inference runs without dropout",
    "max_position_embeddings": "the trained context length; rotary positions need no table and the runtime's "
                               "token limits bound the context",
    # use_sliding_window (read) must be false, so no layer slides and these two select nothing.
    "sliding_window": "used only with use_sliding_window, which must be false",
    "max_window_layers": "used only with use_sliding_window, which must be false",
    "layer_types": "transformers derives it from use_sliding_window (false: every layer full attention)",
}
TEXT = _policy(_DECODER_READ, _DECODER_HARMLESS, head=True)
TALKER = _policy(_DECODER_READ | {"embedding_size", "tts_codec_pad_token_id", "tts_codec_start_token_id",
                                  "tts_codec_end_token_id", "tts_codec_mask_token_id", "tts_text_end_token_id",
                                  "tts_text_pad_token_id"}, {
    **_DECODER_HARMLESS,
    **dict.fromkeys((*_THINKER_IDS, "spatial_merge_size", "position_id_per_seconds", "seconds_per_chunk"),
                    "a copy of the thinker's media setting; the talker reads the thinker's states, not media"),
    "tts_text_start_token_id": "transformers starts the talker's text with the chosen voice's own bos id "
                               "(spk_dict.pt), as we do",
}, head=True)
TOKEN2WAV = _policy({"dit_config", "bigvgan_config"})
DIT = _policy({"hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "ff_mult", "emb_dim",
               "block_size", "look_ahead_layers", "look_backward_layers", "repeats", "num_embeds", "mel_dim",
               "rope_parameters", "rope_theta", "enc_emb_dim", "enc_dim", "enc_channels", "enc_kernel_sizes",
               "enc_dilations", "enc_attention_channels", "enc_res2net_scale", "enc_se_channels"}, {
    "dropout": "a training setting: inference runs without dropout",
    "max_position_embeddings": "rotary positions need no table; the code stream's length bounds them",
})
BIGVGAN = _policy({"mel_dim", "upsample_initial_channel", "resblock_kernel_sizes", "resblock_dilation_sizes",
                   "upsample_rates", "upsample_kernel_sizes"})
# The towers run transformers' own modules built from the same dict (families/qwen_omni/encoders.py): every key of
# their config classes is read by the code that runs.
AUDIO = _policy({"activation_dropout", "activation_function", "attention_dropout", "d_model", "dropout",
                 "encoder_attention_heads", "encoder_ffn_dim", "encoder_layers", "max_source_positions", "n_window",
                 "num_hidden_layers", "num_mel_bins", "output_dim", "scale_embedding"})
VISION = _policy({"depth", "fullatt_block_indexes", "hidden_act", "hidden_size", "in_channels", "intermediate_size",
                  "num_heads", "out_hidden_size", "patch_size", "rope_parameters", "spatial_merge_size",
                  "temporal_patch_size", "window_size"})
