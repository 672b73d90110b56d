"""What one tower reads, and the shapes of its batches.

`Side` bundles it: the tokenizer, the side's max length and its categorical fields
(`features`). `Inputs` is the pair (query side, document side); training batches,
evaluation and search all encode texts through it. A batch is padded to few lengths
(`length_bucket`), so each compiles once, and cut to the bucket of its longest text:
padding never changes a vector.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import logging

from dualjax.text.features import Fields, SideFeatures
from dualjax.text.tokenizers import Tokenizer

# Texts over this many times max_len words cost time and memory for tokens never read.
LONG_TEXT_FACTOR = 100
_warned_long = [False]  # once per process


def _warn_if_long(texts: Sequence[str], max_len: int) -> None:
    """Warns (once) of a text of more than LONG_TEXT_FACTOR x max_len words: only its
    first max_len tokens are read, but all of it is normalised and split each time."""
    if _warned_long[0]:
        return
    limit = LONG_TEXT_FACTOR * max_len
    for t in texts:
        if len(t) > limit and len(t.split()) > limit:  # the character test is the cheap one
            _warned_long[0] = True
            logging.warning("a text of %d words (%d characters) is over %d x max_len=%d: "
                            "only its first %d tokens are read, but all of it is tokenised "
                            "each time it is read; shorten such texts (said once): %r...",
                            len(t.split()), len(t), LONG_TEXT_FACTOR, max_len, max_len,
                            t[:60])
            return


@dataclasses.dataclass(frozen=True)
class Side:
    """What one tower reads: tokens of at most max_len, and its categorical fields.
    prompt: put before every text of the side before it is tokenised (E5/BGE's "query: ",
    sentence-transformers' `prompts`), its tokens counted in max_len, as
    sentence-transformers counts them."""

    tokenizer: Tokenizer
    max_len: int
    features: SideFeatures = SideFeatures()
    prompt: str = ""

    def encode(self, texts: Sequence[str], fields: Sequence[Fields] | None = None
               ) -> dict[str, np.ndarray]:
        """{"ids", "mask"} [n, max_len] (truncated, padded), plus "cats" [n, num_fields]
        when the side has categorical fields (all missing when `fields` is None)."""
        texts = list(texts)
        if not getattr(self.tokenizer, "reads_heads", False):  # (`text/heads.py`)
            _warn_if_long(texts, self.max_len)
        # Each distinct text tokenized once (a collection's documents come back with each
        # of their queries: SQuAD's pairs hold 2 k paragraphs 42 k times).
        first: dict[str, int] = {}
        rows = np.fromiter((first.setdefault(t, len(first)) for t in texts), np.int64,
                           len(texts))
        distinct = list(first)
        ids, mask = self.tokenizer.encode(
            [self.prompt + t for t in distinct] if self.prompt else distinct, self.max_len)
        if len(distinct) < len(texts):
            ids, mask = ids[rows], mask[rows]
        out = {"ids": ids, "mask": mask}
        if self.features:
            given = fields if fields is not None else [None] * len(texts)
            out["cats"] = self.features.encode(given)
        return out

    def encode_batch(self, texts: Sequence[str], fields: Sequence[Fields] | None = None,
                     rows: int = 0, min_bucket: int | None = None) -> dict[str, np.ndarray]:
        """`encode` of a batch padded with empty texts to `rows` (one shape per length,
        so each compiles once), ids and mask cut to the `length_bucket` (half steps) of
        its longest text: padding never changes a vector."""
        pad = max(rows - len(texts), 0)
        x = self.encode(list(texts) + [""] * pad,
                        None if fields is None else list(fields) + [None] * pad)
        length = length_bucket(int(x["mask"].sum(1).max()), self.max_len,
                               min_bucket or MIN_BUCKET, half_steps=True)
        x["ids"], x["mask"] = x["ids"][:, :length], x["mask"][:, :length]
        return x


MIN_TEXT_TOKENS = 8  # of a side's max_len, what its prompt must leave to the text itself


def prompt_tokens(tokenizer: Tokenizer, prompt: str) -> int:
    """The tokens a prompt takes of a side's max_len, the tokenizer's own ([CLS], [SEP])
    included: what a text encoded behind it has left is max_len minus this."""
    return int(tokenizer.encode([prompt], 4096)[1].sum())


def check_prompt(tokenizer: Tokenizer, prompt: str, max_len: int, what: str) -> None:
    """ValueError naming `what` (the key or file the prompt comes from) when the prompt
    leaves its side fewer than MIN_TEXT_TOKENS tokens for the text: every text would be
    cut to nothing, and every vector of the side would be the prompt's."""
    if not prompt:
        return
    used = prompt_tokens(tokenizer, prompt)
    if max_len - used < MIN_TEXT_TOKENS:
        raise ValueError(f"{what}={prompt[:40] + '...' if len(prompt) > 40 else prompt!r} "
                         f"takes {used} of the side's {max_len} tokens (its max length), "
                         f"leaving {max(max_len - used, 0)} for the text; at least "
                         f"{MIN_TEXT_TOKENS} are needed: shorten the prompt or raise the "
                         "side's max length")


def longest_first(texts: Sequence[str]) -> np.ndarray:
    """The texts' indices, longest (in characters) first, as sentence-transformers batches
    them: the texts of a batch are of about one length, cut to one bucket."""
    return np.argsort([-len(t) for t in texts], kind="stable")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The query side and the document side."""

    query: Side
    document: Side

    def feature_sizes(self) -> dict[str, tuple[tuple[int, int], ...]]:
        return {"query": self.query.features.sizes(), "document": self.document.features.sizes()}


MIN_BUCKET = 32  # shortest padded length a batch is cut to (`length_bucket`)
# Training cuts only the fields of texts longer than this (max_len > 128: the BERT-family
# towers, whose steps take seconds): each length compiles the whole train step again,
# which a run of short texts' cheap steps never pays back. Those it cuts go to
# `length_bucket`'s half steps from 32 (32, 48, 64, 96, 128, 192, 256, ...): a sentence
# query of 40 tokens runs at 48, not at the documents' 256.
TRAIN_CUT_ABOVE = 128
TEXT_PREFIXES = ("q", "d", "m", "n")  # a batch's texts: queries, documents, mixed, hard negatives


def length_bucket(longest: int, max_len: int, min_bucket: int = MIN_BUCKET,
                  half_steps: bool = False) -> int:
    """The padded length of a batch whose longest text has `longest` tokens: the next
    power of two from `min_bucket` on, at most max_len (a few shapes, one compile each).
    half_steps: also 1.5 times each (32, 48, 64, 96, 128, 192, ...): a few more shapes,
    and on NPL's documents at batch 32 a fifth less work than powers of two alone."""
    bucket = min_bucket
    while bucket < longest:
        if half_steps and bucket % 2 == 0 and bucket * 3 // 2 >= longest:
            return min(bucket * 3 // 2, max_len)
        bucket *= 2
    return min(bucket, max_len)


def trim_padding(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` with each text field's ids and mask ("<prefix>_ids", "<prefix>_mask", last
    axis the length) longer than TRAIN_CUT_ABOVE cut to `length_bucket` (half steps) of
    its longest text: padding never changes a text's vector, and a batch of short texts
    need not run at the full max length."""
    out = dict(batch)
    for prefix in TEXT_PREFIXES:
        mask = batch.get(f"{prefix}_mask")
        if mask is None or mask.shape[-1] <= TRAIN_CUT_ABOVE:
            continue
        length = length_bucket(int(mask.sum(-1).max(initial=0)), mask.shape[-1],
                               half_steps=True)
        out[f"{prefix}_ids"] = batch[f"{prefix}_ids"][..., :length]
        out[f"{prefix}_mask"] = mask[..., :length]
    return out


@dataclasses.dataclass(frozen=True)
class InputsSpec:
    """What the sides read, as `train.inputs` builds them (config.model's keys, resolved
    by `config.specs.inputs_spec`; configs/default.py says what each does).

    Attributes:
        tokenizer: model.tokenizer ("hf": the start's, or the file model.tokenizer_path).
        tokenizer_path, vocab_size, num_oov_buckets, trigram_vocab_size: its settings.
        features: (query, document) categorical fields, ((name, embedding size), ...).
        feature_vocab_size, feature_buckets: each field's vocabulary settings.
        max_lens: (query, document) lengths in tokens.
        prompts: (query, document) prompts the config sets ("": the start's, if any).
    """
    tokenizer: str = "word"
    tokenizer_path: str = ""
    vocab_size: int = 20000
    num_oov_buckets: int = 1000
    trigram_vocab_size: int = 40000
    features: tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = ((), ())
    feature_vocab_size: int = 1000
    feature_buckets: int = 100
    max_lens: tuple[int, int] = (32, 32)
    prompts: tuple[str, str] = ("", "")
