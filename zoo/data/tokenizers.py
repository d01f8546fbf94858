"""Tokenizers: character-level and byte-level BPE, both Hugging Face `tokenizers` objects.

A trained tokenizer serialises to one JSON string, which the tasks store inside their checkpoints
(plain text: safe to load with weights_only=True) and reload for generation or translation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# BERT's own tokens (Devlin et al. 2019), reserved by a masked language model's tokenizer (data.special_tokens):
# the masked position, the sequence's first token (pooled for classification), and the end of each segment.
MASK, CLS, SEP = "[MASK]", "[CLS]", "[SEP]"
MASKED_LM_TOKENS = (MASK, CLS, SEP)
KINDS = ("char", "bpe")


def train_char_tokenizer(texts: Iterable[str], special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> Tokenizer:
    """One token per character seen in `texts` (plus the special tokens)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(vocab_size=1 << 20, min_frequency=1, special_tokens=list(special_tokens))
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    min_frequency: int = 2,
    add_prefix_space: bool = False,
) -> Tokenizer:
    """Byte-level BPE (GPT-2 style, Radford et al. 2019): never an unknown character.

    add_prefix_space: treat each text as if it began with a space, so a sentence's first word gets the
    same tokens as anywhere else (for sentence-level data such as translation; decode, then strip).
    """
    if vocab_size <= 256 + len(special_tokens):
        raise ValueError(
            f"data.vocab_size must exceed {256 + len(special_tokens)} for byte-level BPE, got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int | None = None, **kwargs) -> Tokenizer:
    """`kind` is data.tokenizer: char | bpe."""
    if kind == "char":
        return train_char_tokenizer(texts, **kwargs)
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("data.vocab_size must be set for the bpe tokenizer")
        return train_bpe_tokenizer(texts, vocab_size, **kwargs)
    raise ValueError(f"unknown tokenizer {kind!r}; valid choices: {list(KINDS)}")


def tokenizer_to_string(tokenizer: Tokenizer) -> str:
    return tokenizer.to_str()


def tokenizer_from_string(serialised: str) -> Tokenizer:
    return Tokenizer.from_str(serialised)


def batched(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    """Group texts for `train_from_iterator` (faster than one string at a time)."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenizer_kind(tokenizer: Tokenizer) -> str:
    """Which of KINDS built this tokenizer: char (a word-level model over single characters) or bpe."""
    return "char" if isinstance(tokenizer.model, models.WordLevel) else "bpe"


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`; characters a char tokenizer never saw are a one-line error, not silent <unk>s."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    unk = tokenizer.token_to_id(UNK)
    if tokenizer_kind(tokenizer) == "char" and unk is not None and unk in ids:
        unknown = sorted({c for c in text if tokenizer.token_to_id(c) is None})
        known = "".join(sorted(t for t in tokenizer.get_vocab() if len(t) == 1 and t.isprintable()))
        raise ValueError(
            f"characters {unknown} are not in the char tokenizer's vocabulary; valid characters: {known!r}"
        )
    return ids
