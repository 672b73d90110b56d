"""What each side of the model reads, loaded or built once per workdir: the tokenizer
(WORKDIR/vocab.json) and the categorical fields' vocabularies (WORKDIR/features.json),
with each side's max length (`sides.Inputs`). A run builds them from its training
pairs (`train._prepare_input`); a trained workdir reads them back (`trained.py`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from absl import logging

from dualjax import pretrained
from dualjax.errors import ConfigError
from dualjax.text import features, sides, tokenizers
from dualjax.text.sides import InputsSpec
from dualjax.text.tokenizers import Tokenizer


def load_tokenizer(spec: InputsSpec, workdir: str, texts: Callable[[], Iterable[str]],
                   start: pretrained.Pretrained | None = None) -> Tokenizer:
    """WORKDIR/vocab.json if it exists (a resumed or evaluated run), else built from
    `texts()` (the training pairs) as `model.tokenizer` says, or read ("hf": the
    pretrained start's, or model.tokenizer_path), and saved there."""
    path = os.path.join(workdir, "vocab.json")
    if os.path.exists(path):
        return tokenizers.load_tokenizer(path)
    tok: tokenizers.Tokenizer
    if spec.tokenizer == "hf":
        tok = start.tokenizer() if start else pretrained.read_tokenizer(spec.tokenizer_path)
    else:
        tok = tokenizers.build_tokenizer(spec.tokenizer, texts(), vocab_size=spec.vocab_size,
                                         num_oov_buckets=spec.num_oov_buckets,
                                         trigram_vocab_size=spec.trigram_vocab_size)
    tok.save(path)
    logging.info("Tokenizer %s: %d embedding rows, saved to %s", spec.tokenizer,
                 tok.vocab_size, path)
    return tok


def load_inputs(spec: InputsSpec, workdir: str, texts: Callable[[], Iterable[str]],
                fields: Callable[[], Iterable[tuple[features.Fields, features.Fields]]],
                start: pretrained.Pretrained | None = None) -> sides.Inputs:
    """What each side reads: the tokenizer (`load_tokenizer`), the side's max length
    (`InputsSpec.max_lens`) and its categorical fields, whose vocabularies are
    WORKDIR/features.json if it exists, else built from `fields()` ((query fields,
    document fields) per training pair) and saved there."""
    tokenizer = load_tokenizer(spec, workdir, texts, start)
    field_specs = spec.features
    side_fields: tuple[features.SideFeatures, ...] = (features.SideFeatures(),
                                                      features.SideFeatures())
    if any(field_specs):
        path = os.path.join(workdir, "features.json")
        if os.path.exists(path):
            side_fields = features.load(path)
        else:
            records = list(fields())
            built = []
            for i, (name, side_spec) in enumerate(zip(("query", "document"), field_specs,
                                                      strict=True)):
                values = [r[i] for r in records]  # this side's fields of every pair
                side = features.build_side(side_spec, values, spec.feature_vocab_size,
                                           spec.feature_buckets)
                if side:
                    missing = side.missing_counts(side.encode(values))
                    logging.info("Categorical %s fields %s: vocabularies of %s values; missing "
                                 "(id %d) in %s of %d training pairs", name,
                                 [f.name for f in side.fields], [len(f.vocab) for f in side.fields],
                                 features.MISSING_ID, list(missing.values()), len(records))
                built.append(side)
            side_fields = tuple(built)
            features.save(path, *side_fields)
    q_len, d_len = spec.max_lens
    start_prompts = start.prompts if start else {}
    q_prompt, d_prompt = (spec.prompts[0] or start_prompts.get("query", ""),
                          spec.prompts[1] or start_prompts.get("document", ""))
    for key, own, prompt, max_len in (("query_prompt", spec.prompts[0], q_prompt, q_len),
                                      ("document_prompt", spec.prompts[1], d_prompt, d_len)):
        try:  # (the config checks counted it before, where the tokenizer was known)
            sides.check_prompt(tokenizer, prompt, max_len, f"config.model.{key}"
                               if own else f"the start's {key}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return sides.Inputs(sides.Side(tokenizer, q_len, side_fields[0], q_prompt),
                        sides.Side(tokenizer, d_len, side_fields[1], d_prompt))


def unknown_tokens(tokenizer: Tokenizer, texts: Iterable[str]) -> tuple[int, int]:
    """(unknown, total): how many of the texts' tokens the tokenizer does not know (an
    OOV bucket or the unknown id: `tokenizers.known_tokens`), of how many."""
    unknown = total = 0
    for text in texts:
        n = len(tokenizer.token_ids(text))
        unknown += n - tokenizers.known_tokens(tokenizer, text)
        total += n
    return unknown, total


def eval_fields(task) -> list[tuple[features.Fields, features.Fields]]:
    """(query fields, document fields) pairs of an evaluation task's records, to build
    field vocabularies from when there is no training data."""
    queries, corpus = task.query_fields or [], task.corpus_fields or []
    return [(f, None) for f in queries] + [(None, f) for f in corpus]
