"""`model.tokenizer="hf"`: a Hugging Face `tokenizers` JSON (WordPiece, BPE, ...) behind
the project's tokenizer interface (`dualjax.text.tokenizers.Tokenizer`).

The file's own normaliser, pre-tokeniser and post-processor apply (BERT's lowercasing and
[CLS] ... [SEP]); its padding and truncation settings do not: MiniLM's tokenizer.json pads
to 128 and truncates at 128, while sentence-transformers truncates at its max_seq_length
and leaves padding out of the mean. Here a text is truncated to `max_len` ids counting the
special tokens (sentence-transformers' "longest_first" on one text: [CLS], the first
max_len - 2 pieces, [SEP]) and right-padded with 0 under a False mask.

`end_token`: an id put after every text when the post-processor does not end it with a
special token already (a decoder embedder's end-of-text token, whose state is the
text's vector), within max_len: the text is cut one shorter to leave it room, as
e5-mistral and gte-Qwen2 append it.

Of a long text only its head is tokenized where that gives the same ids (`heads`: most
tokenizers split words at spaces; BENCHMARKS.md, "Corpus encoding, static tower").

Saved as JSON {"type": "hf", "tokenizer": <the tokenizers JSON>, "lowercase",
"add_special_tokens", "drop_unknown", "end_token", "version"}, so a workdir and a bundle
carry it whole.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dualjax.text import heads
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
    unknown token out (model2vec does). end_token: put last on every text (-1: none)."""

    def __init__(self, spec: dict[str, Any], lowercase: bool = False,
                 add_special_tokens: bool = True, drop_unknown: bool = False,
                 end_token: int = -1):
        self.spec, self.lowercase = spec, bool(lowercase)
        self.add_special_tokens, self.drop_unknown = bool(add_special_tokens), bool(drop_unknown)
        self.end_token = int(end_token)
        tok = _library().Tokenizer.from_str(json.dumps(spec))
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self._specials = (tok.post_processor.num_special_tokens_to_add(False)
                          if add_special_tokens and tok.post_processor is not None else 0)
        if self.end_token >= tok.get_vocab_size(with_added_tokens=True):
            raise ValueError(f"end_token={self.end_token} is not one of the tokenizer's ids")
        # appended here, unless the post-processor already ends a text with a special
        # token (Qwen3-Embedding's template appends <|endoftext|> while its eos_token is
        # <|im_end|>: that template is how it was trained)
        probe = tok.encode("a", add_special_tokens=self.add_special_tokens)
        self._append = self.end_token >= 0 and probe.special_tokens_mask[-1:] != [1]
        model = spec.get("model", {})
        unk = model.get("unk_token")
        self.unknown_id = tok.token_to_id(unk) if isinstance(unk, str) else None
        self._by_length: dict[int, Any] = {}  # max_len -> a copy that truncates there
        self._heads = heads.cuts_exactly(spec)  # a long text's head alone is tokenized

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
    def reads_heads(self) -> bool:
        """Whether a long text's head alone is tokenized (`text/heads.py`): its length
        then costs nothing."""
        return self._heads

    @property
    def vocab_size(self) -> int:
        """Embedding rows: every id the tokenizer can produce is below it."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _prepare(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def _ids(self, encodings, max_len: int | None) -> list[list[int]]:
        out = []
        room = None if max_len is None else max_len - self._append
        for enc in encodings:
            if room is not None:
                enc.truncate(max(room - self._specials, 0))
            if self._specials:
                enc = self._tok.post_process(enc, None, add_special_tokens=True)
            ids = enc.ids
            if self.drop_unknown and self.unknown_id is not None:
                ids = [i for i in ids if i != self.unknown_id]
            ids = ids if room is None else ids[:max(room, 0)]
            out.append(ids + [self.end_token] if self._append else ids)
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
        room = max_len - self._append  # (one left for the end token)
        if room <= self._specials:  # (only the special tokens fit: the plain way)
            return _padded(self._ids(self._tok.encode_batch_fast(
                texts, add_special_tokens=False), max_len), max_len)
        # Truncated and post-processed ([CLS] ... [SEP]) inside the library, in its own
        # threads: per text in Python, that was a third of the time of a batch. The fast
        # form leaves out the character offsets, which nothing here reads (BENCHMARKS.md,
        # "Corpus encoding, static tower").
        tok = self._truncating(room)
        if not self._heads:
            encodings = tok.encode_batch_fast(texts, add_special_tokens=self.add_special_tokens)
        else:  # each text's head (`heads`); whole where a head gives too few tokens
            cut = [heads.head(t, room * heads.CHARS_PER_TOKEN) for t in texts]
            encodings = tok.encode_batch_fast(cut, add_special_tokens=self.add_special_tokens)
            short = [i for i, (t, c, e) in enumerate(zip(texts, cut, encodings, strict=True))
                     if c is not t and len(e) < room]
            if short:
                again = tok.encode_batch_fast([texts[i] for i in short],
                                              add_special_tokens=self.add_special_tokens)
                for i, e in zip(short, again, strict=True):
                    encodings[i] = e
        lists = [e.ids for e in encodings]
        if self.drop_unknown and self.unknown_id is not None:
            lists = [[i for i in ids if i != self.unknown_id] for ids in lists]
        if self._append:
            lists = [ids + [self.end_token] for ids in lists]
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

    @property
    def appends_end(self) -> bool:
        """Whether `end_token` is put after the post-processor's ids here (False: there is
        none, or the post-processor ends a text with it itself)."""
        return self._append

    def token_of(self, token_id: int) -> str | None:
        """The piece or special token of id `token_id` (None: no such id)."""
        return self._tok.id_to_token(token_id)

    def with_end_token(self) -> dict:
        """The tokenizers JSON with `end_token` put last by its post-processor (after
        the post-processor it had), so a reader of the file alone encodes as this does."""
        if not self._append:
            return self.spec
        end = self.token_of(self.end_token)
        processor = self.spec.get("post_processor") or {}
        if processor.get("type") == "TemplateProcessing":  # ("<s> $A": "<s> $A <eos>")
            piece = {"SpecialToken": {"id": end, "type_id": 0}}
            specials = {**processor.get("special_tokens", {}),
                        end: {"id": end, "ids": [self.end_token], "tokens": [end]}}
            return {**self.spec, "post_processor": {
                **processor, "single": [*processor["single"], piece],
                "pair": [*processor["pair"], piece], "special_tokens": specials}}
        # (a template after another post-processor, in a Sequence, would read the
        # special tokens it put as text)
        library = _library()
        tok = library.Tokenizer.from_str(json.dumps(self.spec))
        template = library.processors.TemplateProcessing(
            single=f"$A {end}", pair=f"$A {end} $B:1 {end}:1",
            special_tokens=[(end, self.end_token)])
        tok.post_processor = (template if tok.post_processor is None else
                              library.processors.Sequence([tok.post_processor, template]))
        return json.loads(tok.to_str())

    def token_id(self, token: str) -> int | None:
        """The id of piece or special token `token` (None: not in the vocabulary)."""
        return self._tok.token_to_id(token)

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lowercase": self.lowercase,
                               "add_special_tokens": self.add_special_tokens,
                               "drop_unknown": self.drop_unknown}
        if self.end_token >= 0:  # (absent from files written before it existed)
            out["end_token"] = self.end_token
        return out

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, {"type": TYPE, "tokenizer": self.spec, **self.settings(),
                          "version": FORMAT_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFTokenizer:
        payload = read_tokenizer_json(path)
        try:
            check_header(payload, TYPE)
            return cls(payload["tokenizer"], payload["lowercase"],
                       payload["add_special_tokens"], payload.get("drop_unknown", False),
                       payload.get("end_token", -1))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"corrupt tokenizer file {os.fspath(path)}: {e}") from None

    def __getstate__(self):  # tokenizers.Tokenizer pickles, but rebuilding is cleaner
        return (self.spec, self.settings())

    def __setstate__(self, state):
        spec, settings = state
        self.__init__(spec, **settings)
