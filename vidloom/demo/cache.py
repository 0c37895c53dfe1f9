"""Writing a family's demo checkpoint into the user's cache: once, atomically, from seeded random weights.

Every `*-demo` card is the real architecture at a tiny size. Its folder is written in the family's
diffusers layout with our own modules (diffusers is a test dependency only), so loading it goes
through the same reader as a real checkpoint. These helpers are what every family's writer shares.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError
from vidloom.loading.name_map import NameMap
from vidloom.loading.safetensors_io import DIFFUSERS_WEIGHTS

NOISE_NOTE = (
    "{demo} has RANDOM weights (the real {family} architecture at a tiny size): its output is noise by "
    "design; it exists so every {family} feature runs offline in seconds. For real output pass real {family} "
    "weights with --model (a Diffusers checkpoint directory or Hub repo id{example})."
)


def noise_note(demo: str, family: str, example: str = "") -> str:
    """The card note every demo carries: its output is noise, and where real weights come from."""
    return NOISE_NOTE.format(demo=demo, family=family, example=f", e.g. {example}" if example else "")


def ensure_written(cache_dir: Path, name: str, write: Callable[[Path], None],
                   marker: str = "model_index.json") -> Path:
    """`cache_dir/name`, written by `write(folder)` first if this cache has none (`marker`: a file every
    complete folder has; a transformers checkpoint's is config.json).

    The folder appears with all its files or not at all (staged, then renamed), so a reader never
    sees a half-written demo and two processes writing at once both end with the same folder.
    """
    target = cache_dir / name
    if (target / marker).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir))
    try:
        write(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / marker).is_file():  # not a concurrent writer's win
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def fill_zeros(module: torch.nn.Module, std: float = 0.02) -> None:
    """Give zero-initialised parameters small noise.

    Zero output projections and modulation tables would make a random network predict a constant;
    small noise keeps every layer exercised.
    """
    with torch.no_grad():
        for param in module.parameters():
            if not param.any():
                param.normal_(0.0, std)


def save_merged(folder: Path, parts: Iterable[tuple[torch.nn.Module, NameMap]], stem: str = DIFFUSERS_WEIGHTS) -> None:
    """Write several modules that one checkpoint folder holds (e.g. Cosmos3's understanding and generation
    pathways share transformer/) as one safetensors file in checkpoint naming."""
    state: dict[str, torch.Tensor] = {}
    for module, name_map in parts:
        for name, tensor in module.state_dict().items():
            key = name_map.to_checkpoint(name)
            if key in state:
                raise CheckpointError(f"{folder}: two modules write tensor {key!r}")
            state[key] = tensor.detach().contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / f"{stem}.safetensors"))


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


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
