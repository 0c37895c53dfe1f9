"""The PreTrainedConfig attributes every transformers config.json part may hold, and a KeyPolicy builder for the
parts of a transformers checkpoint (Qwen2.5-Omni, Qwen3-Omni): what their config_keys tables share."""

from __future__ import annotations

from vidloom.loading.key_policy import KeyPolicy, Refusal

WRITER = "written by transformers' save_pretrained next to the sizes; it says nothing about the weights"

GENERATION = ("a generation default transformers 4.x wrote into every nested config; sampling settings come "
              "from the request and generation_config.json")
BOOKKEEPING = ("transformers bookkeeping (outputs, training, labels, export); it sets no size and selects no "
               "layer in these classes")
SPECIAL_ID = ("a special token id the tokenizer's vocabulary also gives; the chat template and loops use the "
              "tokenizer's")
# PreTrainedConfig's own attributes (transformers 4.52 to_dict of every part; 5.x keeps a few), with why each
# is bookkeeping here. Every file transformers writes has them, so they are the policies' `meta`: accepted
# without a record (docs/reference/config-keys.md lists them with these reasons).
PRETRAINED_BOOKKEEPING: dict[str, str] = {
    **dict.fromkeys(("_name_or_path", "architectures", "model_type", "transformers_version",
                     "_attn_implementation_autoset"), WRITER),
    **dict.fromkeys((
        "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
        "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
        "forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups",
        "num_beams", "num_return_sequences", "output_scores", "remove_invalid_values", "repetition_penalty",
        "return_dict_in_generate", "suppress_tokens", "temperature", "top_k", "top_p", "typical_p",
        "decoder_start_token_id", "use_cache"), GENERATION),
    **dict.fromkeys((
        "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16", "tf_legacy_loss",
        "chunk_size_feed_forward", "problem_type", "finetuning_task", "id2label", "label2id", "prefix",
        "task_specific_params", "tokenizer_class", "is_decoder", "is_encoder_decoder", "add_cross_attention",
        "cross_attention_hidden_size", "tie_encoder_decoder", "initializer_range"), BOOKKEEPING),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "sep_token_id", "pad_token_id"), SPECIAL_ID),
    "torch_dtype": "transformers' load-time precision hint (dtype since 5.0); the runtime's precision decides ours",
    "dtype": "transformers' load-time precision hint (torch_dtype before 5.0); the runtime's precision decides ours",
}
TRANSFORMERS_META = frozenset(PRETRAINED_BOOKKEEPING)
TIED_HEAD = ("we load the head from its own tensor: a tied checkpoint saves none, and the weight loader then "
             "names the missing tensor")
NO_HEAD = "this part has no output head to tie to its embeddings"
PRETRAINED_REFUSED = {"pruned_heads": Refusal(({},), "pruned attention heads change the layer shapes we build")}


def transformers_policy(read: set[str], harmless: dict[str, str] | None = None,
                        refused: dict[str, Refusal] | None = None, head: bool = False) -> KeyPolicy:
    """A part's policy; `head`: the part is a decoder with an output head (tie_word_embeddings means something)."""
    return KeyPolicy(frozenset(read), {"tie_word_embeddings": TIED_HEAD if head else NO_HEAD, **(harmless or {})},
                     {**PRETRAINED_REFUSED, **(refused or {})}, meta=TRANSFORMERS_META)
