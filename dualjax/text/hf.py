"""`model.tokenizer="hf"`: a Hugging Face `tokenizers` JSON (WordPiece, BPE, ...) behind
the project's tokenizer interface (`dualjax.text.tokenizers.Tokenizer`).

The file's own normaliser, pre-tokeniser and post-processor apply (BERT's lowercasing and
[CLS] ... [SEP]); its padding and truncation settings do not: MiniLM's tokenizer.json pads
to 128 and truncates at 128, while sentence-transformers truncates at its max_seq_length
and leaves padding out of the mean. Here a text is truncated to `max_len` ids counting the
special tokens (sentence-transformers' "longest_first" on one text: [CLS], the first
max_len - 2 pieces, [SEP]) and right-padded with 0 under a False mask.

Saved as JSON {"type": "hf", "tokenizer": <the tokenizers JSON>, "lowercase",
"add_special_tokens", "drop_unknown", "version"}, so a workdir and a bundle carry it whole.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dualjax.text.words import FORMAT_VERSION, check_header, read_tokenizer_json, write_json

TYPE = "hf"


def _library():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("model.tokenizer='hf' needs the tokenizers library, which "
                          "dualjax installs: pip install -e . (or pip install tokenizers)"
                          ) from None
    return tokenizers


def _padded(lists: list[list[int]], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """ids int32 [n, max_len] (right-padded with 0) and mask bool [n, max_len] of token
    id lists (each cut to max_len), without a loop over the rows."""
    lengths = np.fromiter((min(len(seq), max_len) for seq in lists), np.int64, len(lists))
    mask = np.arange(max_len) < lengths[:, None]
    ids = np.zeros((len(lists), max_len), np.int32)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(seq[:max_len] for seq in lists),
                            np.int32, int(lengths.sum()))
    return ids, mask


class HFTokenizer:
    """A `tokenizers.Tokenizer` with the settings a pretrained model was trained with.

    lowercase: lowercase the text first (WordLlama's BPE is case-sensitive but meant for
    lowercased text). add_special_tokens: apply the file's post-processor ([CLS] ...
    [SEP] for BERT; static tables average the pieces alone). drop_unknown: leave the
    unknown token out (model2vec does)."""

    def __init__(self, spec: dict[str, Any], lowercase: bool = False,
                 add_special_tokens: bool = True, drop_unknown: bool = False):
        self.spec, self.lowercase = spec, bool(lowercase)
        self.add_special_tokens, self.drop_unknown = bool(add_special_tokens), bool(drop_unknown)
        tok = _library().Tokenizer.from_str(json.dumps(spec))
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self._specials = (tok.post_processor.num_special_tokens_to_add(False)
                          if add_special_tokens and tok.post_processor is not None else 0)
        model = spec.get("model", {})
        unk = model.get("unk_token")
        self.unknown_id = tok.token_to_id(unk) if isinstance(unk, str) else None
        self._by_length: dict[int, Any] = {}  # max_len -> a copy that truncates there

    @classmethod
    def from_file(cls, path: str | os.PathLike, **settings: bool) -> HFTokenizer:
        """A tokenizers JSON file (tokenizer.json); errors name the path."""
        spec = read_tokenizer_json(path)
        try:
            return cls(spec, **settings)
        except Exception as e:  # the Rust side's errors are plain Exceptions
            raise ValueError(f"{os.fspath(path)}: not a tokenizers JSON this library reads: "
                             f"{e}") from None

    @property
    def vocab_size(self) -> int:
        """Embedding rows: every id the tokenizer can produce is below it."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _prepare(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def _ids(self, encodings, max_len: int | None) -> list[list[int]]:
        out = []
        for enc in encodings:
            if max_len is not None:
                enc.truncate(max(max_len - self._specials, 0))
            if self._specials:
                enc = self._tok.post_process(enc, None, add_special_tokens=True)
            ids = enc.ids
            if self.drop_unknown and self.unknown_id is not None:
                ids = [i for i in ids if i != self.unknown_id]
            out.append(ids if max_len is None else ids[:max_len])
        return out

    def token_ids(self, text: str) -> list[int]:
        """Unpadded ids of `text`, special tokens included."""
        enc = self._tok.encode(self._prepare(text), add_special_tokens=False)
        return self._ids([enc], None)[0]

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """ids int32 [n, max_len] (special tokens included, truncated, right-padded with
        0) and mask bool [n, max_len], True on real tokens."""
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        texts = [self._prepare(t) for t in texts]
        if max_len <= self._specials:  # (only the special tokens fit: the plain way)
            return _padded(self._ids(self._tok.encode_batch(texts, add_special_tokens=False),
                                     max_len), max_len)
        # Truncated and post-processed ([CLS] ... [SEP]) inside the library, in its own
        # threads: per text in Python, that was a third of the time of a batch.
        encodings = self._truncating(max_len).encode_batch(
            texts, add_special_tokens=self.add_special_tokens)
        lists = [e.ids for e in encodings]
        if self.drop_unknown and self.unknown_id is not None:
            lists = [[i for i in ids if i != self.unknown_id] for ids in lists]
        return _padded(lists, max_len)

    def _truncating(self, max_len: int):
        """The tokenizer truncating to `max_len` tokens, special ones included (one per
        max length, made at its first use and kept: few lengths are used)."""
        if max_len not in self._by_length:
            tok = _library().Tokenizer.from_str(self._tok.to_str())
            tok.enable_truncation(max_len)
            self._by_length[max_len] = tok
        return self._by_length[max_len]

    def content_ids(self, text: str) -> list[int]:
        """The ids of `text`'s own pieces: no special token, and no unknown token where
        the tokenizer drops it."""
        ids = self._tok.encode(self._prepare(text), add_special_tokens=False).ids
        return [i for i in ids if not (self.drop_unknown and i == self.unknown_id)]

    def known(self, text: str) -> int:
        """How many of `text`'s pieces are known (not the unknown token, not special)."""
        enc = self._tok.encode(self._prepare(text), add_special_tokens=False)
        return sum(i != self.unknown_id for i in enc.ids)

    def settings(self) -> dict[str, bool]:
        return {"lowercase": self.lowercase, "add_special_tokens": self.add_special_tokens,
                "drop_unknown": self.drop_unknown}

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, {"type": TYPE, "tokenizer": self.spec, **self.settings(),
                          "version": FORMAT_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFTokenizer:
        payload = read_tokenizer_json(path)
        try:
            check_header(payload, TYPE)
            return cls(payload["tokenizer"], payload["lowercase"],
                       payload["add_special_tokens"], payload.get("drop_unknown", False))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: {e}") from None

    def __getstate__(self):  # tokenizers.Tokenizer pickles, but rebuilding is cleaner
        return (self.spec, self.settings())

    def __setstate__(self, state):
        spec, settings = state
        self.__init__(spec, **settings)
