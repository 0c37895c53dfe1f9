"""The demo checkpoints' tokenizers: trained or counted offline from a few sentences, the same on every write."""

from __future__ import annotations

import math
from typing import Any, Iterable

# Sentences the demo tokenizer's vocabulary is counted from (offline; see train_t5_tokenizer).
TOKENIZER_CORPUS = (
    "a cat walks along the beach at sunset", "a red fox jumps over a frozen river",
    "the camera pans slowly across snowy mountains", "two dogs play in a green park",
    "a city street at night with neon lights and rain", "waves crash against the rocks",
    "a astronaut floats inside a space station", "a timelapse of clouds over a desert",
    "close up of a flower opening in the morning light", "a train crosses a bridge in autumn",
    "children fly kites on a windy hill", "a drone shot of a forest and a lake",
)
TOKENIZER_VOCAB = 256  # at most this many tokens, specials included
# ChatML, as Qwen-family checkpoints ship it (Qwen3-VL-based Cosmos3, Qwen3-Omni): string or list-of-parts content,
# text parts only.
CHATML_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{% else %}"
    "{%- for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_t5_tokenizer() -> Any:
    """A small Unigram tokenizer counted offline from TOKENIZER_CORPUS (see unigram_vocab), saved in T5 form.

    The same on every call, so every fresh write of a checkpoint that holds it gives the same files."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    normalizer, pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
    words = [word for line in TOKENIZER_CORPUS
             for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line))]
    vocab = [(token, 0.0) for token in specials] + unigram_vocab(words, TOKENIZER_VOCAB - len(specials))
    tok = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(specials)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)]
    )
    return T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", extra_ids=0)


def train_chat_tokenizer(corpus: Iterable[str], specials: tuple[str, ...], chat_template: str,
                         eos: str = "<|im_end|>", vocab_size: int = 320) -> Any:
    """A byte-level BPE trained offline on `corpus`, as a Qwen2 tokenizer (the Qwen families' kind) with
    `specials` as single tokens and `chat_template` for apply_chat_template. The first special is the pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # its bar goes to stdout, past our quiet switches
    tok.train_from_iterator(list(corpus), trainer)
    tokenizer = Qwen2TokenizerFast(tokenizer_object=tok, pad_token=specials[0], eos_token=eos,
                                   unk_token=None, bos_token=None)
    tokenizer.chat_template = chat_template
    return tokenizer


def train_gemma_tokenizer(corpus: Iterable[str], vocab_size: int, model_max_length: int) -> Any:
    """A byte-level BPE trained offline on `corpus`, as a Gemma tokenizer (<pad>/<eos>/<bos>/<unk> like Gemma's,
    <bos> prepended, left padding): the text encoders of LTX-2 (Gemma3) and SANA-WM (Gemma-2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GemmaTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                      special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    return GemmaTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                              unk_token="<unk>", padding_side="left", model_max_length=model_max_length)


def unigram_vocab(words: Iterable[str], size: int, max_piece_len: int = 6, min_count: int = 2) -> list[tuple[str, float]]:
    """A Unigram vocabulary counted from pre-tokenized `words`: every character, then the substrings of up
    to `max_piece_len` characters seen at least `min_count` times (most characters covered first), each
    scored log(count / total), highest first, ties by text. At most `size` pieces.

    Counted, not trained: the `tokenizers` UnigramTrainer gives a different vocabulary on every run
    (hash-map order decides which dropped character gets which penalty score and which of two tied pieces
    gets the lower id, and its EM sums differ in the last digits), so checkpoints written from it differ
    between fresh writes. These are SentencePiece's seed-vocabulary scores, without its EM pruning.
    """
    counts: dict[str, int] = {}
    for word in words:
        for start in range(len(word)):
            for end in range(start + 1, min(len(word), start + max_piece_len) + 1):
                counts[word[start:end]] = counts.get(word[start:end], 0) + 1
    chars = sorted(piece for piece in counts if len(piece) == 1)
    if len(chars) > size:
        raise ValueError(f"unigram_vocab: the corpus has {len(chars)} characters, more than size={size}")
    longer = sorted((piece for piece, n in counts.items() if len(piece) > 1 and n >= min_count),
                    key=lambda piece: (-counts[piece] * len(piece), piece))
    pieces = chars + longer[:size - len(chars)]
    total = sum(counts[piece] for piece in pieces)
    scored = [(piece, math.log(counts[piece] / total)) for piece in pieces]
    return sorted(scored, key=lambda item: (-item[1], item[0]))
