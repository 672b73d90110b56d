"""Make the reference fixtures for dualjax's pretrained-encoder support.

Writes, under --out (default tests/fixtures/pretrained):

  tiny_bert/                 a tiny random BERT (hidden 32, 2 layers, 4 heads, intermediate
                             37, 64 positions, ~600-piece WordPiece vocab trained on ADI + MED
                             text) saved as a complete sentence-transformers folder in the same
                             layout as all-MiniLM-L6-v2 (config.json, model.safetensors,
                             tokenizer.json, modules.json, sentence_bert_config.json with
                             max_seq_length 48, 1_Pooling/config.json with mean pooling).
                             Its tokenizer.json deliberately has truncation at 16 and fixed
                             padding to 16 switched ON (MiniLM's has 128/128): a loader must
                             ignore those settings.
  tiny_bert_reference.npz    texts, sources, st_vectors [n, 32] (SentenceTransformer.encode,
                             mean pool + L2 norm, max_seq_length 48), cls_vectors [n, 32]
                             (BertModel last_hidden_state[:, 0], no pooler, no norm, truncation
                             at 48), token_ids [n, max_len] int32 padded with -1.
  minilm_reference.npz       texts, sources, st_vectors [n, 384] from
                             SentenceTransformer(all-MiniLM-L6-v2) with default settings
                             (max_seq_length 256), token_ids padded with -1, model_sha256,
                             tokenizer_sha256.
  wordllama_reference.npz    texts (lowercased), sources, vectors [n, 256] =
                             wordllama.inference.WordLlamaInference.embed(texts, norm=True),
                             token_ids padded with -1 (add_special_tokens=False), weights_sha256,
                             tokenizer_sha256.

It also prints, for each fixture, the max abs difference between the reference library and a
plain numpy re-implementation written below (numpy BERT forward, mean pool, L2 norm; numpy
table lookup + mean + L2 norm for WordLlama).

The libraries it needs (torch, transformers, sentence-transformers, wordllama) are NOT
dependencies of dualjax: run it in a separate reference virtualenv, e.g.

    python3 -m venv /work/refenv
    /work/refenv/bin/pip install torch==2.13.0 transformers sentence-transformers \\
        safetensors tokenizers numpy wordllama==0.4.0.post1
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 /work/refenv/bin/python \\
        scripts/make_pretrained_fixtures.py \\
        --minilm_dir /tmp/pretrained/all-MiniLM-L6-v2 \\
        --wordllama_weights /tmp/pretrained/wl_src/wordllama/weights/l2_supercat_256.safetensors \\
        --wordllama_tokenizer \\
            /tmp/pretrained/wl_src/wordllama/tokenizers/l2_supercat_tokenizer_config.json \\
        --data ../shared/data --out tests/fixtures/pretrained

(run from the repository root). Nothing is downloaded: every model is read from a local
folder. The committed fixtures were made with torch 2.13.0+cpu, transformers 5.24.0,
sentence-transformers 6.2.0, tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6 and
wordllama 0.4.0.post1; reruns write byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]

TINY_MAX_SEQ = 48
TINY_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# --------------------------------------------------------------------------------------------
# Text selection (all real text from the shared data; fixed ids so reruns pick the same texts)
# --------------------------------------------------------------------------------------------


class Data:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._beir: dict = {}
        self._squad = None

    def _load_beir(self, name):
        if name not in self._beir:
            corpus, queries = {}, {}
            with open(self.root / name / "corpus.jsonl", encoding="utf-8") as f:
                for line in f:
                    o = json.loads(line)
                    corpus[o["_id"]] = (o.get("title", "") or "", o["text"])
            with open(self.root / name / "queries.jsonl", encoding="utf-8") as f:
                for line in f:
                    o = json.loads(line)
                    queries[o["_id"]] = o["text"]
            self._beir[name] = (corpus, queries)
        return self._beir[name]

    def doc(self, name, _id):
        title, text = self._load_beir(name)[0][_id]
        return f"{title} {text}".strip()

    def query(self, name, _id):
        return self._load_beir(name)[1][_id]

    def _load_squad(self):
        if self._squad is None:
            with open(self.root / "squad" / "dev-v1.1.json", encoding="utf-8") as f:
                self._squad = json.load(f)["data"]
        return self._squad

    def squad_paragraph(self, title, index):
        for art in self._load_squad():
            if art["title"] == title:
                return art["paragraphs"][index]["context"]
        raise KeyError(title)

    def squad_question(self, startswith):
        for art in self._load_squad():
            for p in art["paragraphs"]:
                for q in p["qas"]:
                    if q["question"].startswith(startswith):
                        return q["question"]
        raise KeyError(startswith)

    def get(self, source):
        """source: 'npl/q/63', 'med/d/14', 'squad/p/Genghis_Khan/52', 'squad/q/<prefix>'."""
        parts = source.split("/", 2)
        if parts[0] == "squad":
            if parts[1] == "p":
                title, idx = parts[2].rsplit("/", 1)
                return self.squad_paragraph(title, int(idx))
            return self.squad_question(parts[2])
        name, kind, _id = parts
        return self.query(name, _id) if kind == "q" else self.doc(name, _id)

    def training_texts(self):
        """A few hundred lower-case texts to train the tiny WordPiece vocabulary on."""
        out = []
        for name, n_docs in (("adi", None), ("med", 300)):
            corpus, queries = self._load_beir(name)
            docs = list(corpus)[:n_docs] if n_docs else list(corpus)
            out += [self.doc(name, i) for i in docs]
            out += list(queries.values())
        return out


TINY_SOURCES = [
    "adi/q/20",  # 'Testing automated information systems.' (short, capital T)
    "time/q/1",  # upper-case TIME query
    "squad/q/Which Super Bowl halftime show did Beyonc",  # upper case + accent
    "med/q/1",
    "adi/d/55",
    "med/d/21",
    "adi/d/5",  # > 48 word pieces: truncated
    "squad/p/Genghis_Khan/52",  # accents, CJK character, long: truncated
    "squad/p/Ctenophora/0",  # IPA/Greek in the first 48 pieces: [UNK]s; truncated
]

MINILM_SOURCES = [
    "npl/q/63",  # 'LOW PASS LATTICE FILTERS' (very short, upper case)
    "med/q/23",  # 'infantile autism.' (very short)
    "time/q/1",  # upper-case TIME query
    "adi/q/1",
    "squad/q/Which Super Bowl halftime show did Beyonc",  # accent
    "adi/d/1",  # title + text
    "npl/d/3334",  # 299 word pieces > 256
    "time/d/018",  # upper-case TIME document, 293 word pieces > 256
    "med/d/14",  # 270 word pieces > 256
    "squad/p/Ctenophora/0",  # Greek, IPA, combining-ish letters; 258 pieces > 256
    "squad/p/Genghis_Khan/52",  # accent + CJK character
    "squad/p/Harvard_University/4",  # zero-width space U+200B
]

WORDLLAMA_SOURCES = [
    "npl/q/63",
    "time/q/1",
    "adi/q/1",
    "med/q/1",
    "squad/q/Which Super Bowl halftime show did Beyonc",
    "adi/d/55",
    "npl/d/11402",
    "med/d/21",
    "time/d/018",
    "squad/p/Genghis_Khan/52",
    "squad/p/Martin_Luther/0",  # IPA with a combining mark, en dash
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pad_ids(rows) -> np.ndarray:
    n = max(len(r) for r in rows)
    out = np.full((len(rows), n), -1, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class InputRecorder:
    """Forward pre-hook on the HF model: records exactly what sentence-transformers fed it."""

    def __init__(self, module):
        # sentence-transformers >= 6 calls model.forward(...) directly (no __call__, so no
        # torch hooks fire): wrap the instance's forward instead.
        self.calls = []
        self.module = module
        orig = module.forward

        def forward(*args, **kwargs):
            self._hook(module, args, kwargs)
            return orig(*args, **kwargs)

        module.forward = forward

    def _hook(self, module, args, kwargs):
        rec = {}
        for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids"):
            v = kwargs.get(k)
            rec[k] = None if v is None else v.detach().cpu().numpy()
        if rec["input_ids"] is None and args:
            rec["input_ids"] = args[0].detach().cpu().numpy()
        self.calls.append(rec)

    def rows(self):
        """Unpadded id rows of every batch seen, plus facts about the other inputs."""
        rows, facts = [], {"token_type_ids": set(), "position_ids": set()}
        for rec in self.calls:
            ids, mask = rec["input_ids"], rec["attention_mask"]
            if mask is None:
                mask = np.ones_like(ids)
            for r in range(ids.shape[0]):
                m = mask[r].astype(bool)
                # right padding only
                assert m[: m.sum()].all(), "sentence-transformers padded on the left?"
                rows.append(ids[r, m].tolist())
            tt = rec["token_type_ids"]
            facts["token_type_ids"].add(
                "not passed" if tt is None else ("all zeros" if not tt.any() else "NONZERO")
            )
            facts["position_ids"].add("not passed" if rec["position_ids"] is None else "passed")
        return rows, facts

    def close(self):
        del self.module.forward  # back to the class's forward


def st_encode_with_ids(st, texts, label):
    """Batched encode (the fixture vectors) and one-text-at-a-time encodes (the token ids)."""
    rec = InputRecorder(st[0].auto_model)
    t0 = time.perf_counter()
    vectors = st.encode(texts, convert_to_numpy=True)
    dt = time.perf_counter() - t0
    batch_rows, facts = rec.rows()
    rec.calls.clear()
    single_rows, single_vecs = [], []
    for t in texts:
        single_vecs.append(st.encode([t], convert_to_numpy=True)[0])
        rows, _ = rec.rows()
        rec.calls.clear()
        assert len(rows) == 1
        single_rows.append(rows[0])
    rec.close()
    assert sorted(map(tuple, batch_rows)) == sorted(map(tuple, single_rows)), (
        f"{label}: batched and single-text tokenisations differ"
    )
    single_vecs = np.stack(single_vecs)
    print(
        f"[{label}] ST encode of {len(texts)} texts took {dt:.3f}s; "
        f"batched vs one-at-a-time max abs diff {np.abs(single_vecs - vectors).max():.2e}; "
        f"token_type_ids: {sorted(facts['token_type_ids'])}; "
        f"position_ids: {sorted(facts['position_ids'])}"
    )
    return np.asarray(vectors, dtype=np.float32), single_rows, facts, dt


# --------------------------------------------------------------------------------------------
# numpy re-implementations (the sanity checks)
# --------------------------------------------------------------------------------------------

try:
    from scipy.special import erf as _erf
except Exception:  # pragma: no cover
    _erf = np.vectorize(math.erf)


def np_gelu(x, approx=False):
    if approx:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def np_bert(w, ids, cfg, gelu_approx=False):
    """Unpadded single-sequence BERT forward in float64; returns last_hidden_state [n, d]."""
    eps = cfg["layer_norm_eps"]
    H = cfg["num_attention_heads"]
    n = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = np_layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    d = x.shape[-1]
    hd = d // H
    for layer in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."

        def lin(v, name, p=p):
            return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q = lin(x, "attention.self.query").reshape(n, H, hd).transpose(1, 0, 2)
        k = lin(x, "attention.self.key").reshape(n, H, hd).transpose(1, 0, 2)
        v = lin(x, "attention.self.value").reshape(n, H, hd).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, d)
        a = lin(ctx, "attention.output.dense")
        x = np_layer_norm(
            x + a,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        h = np_gelu(lin(x, "intermediate.dense"), gelu_approx)
        o = lin(h, "output.dense")
        x = np_layer_norm(
            x + o, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
        )
    return x


def np_load_safetensors(path):
    from safetensors.numpy import load_file

    return {
        k: v.astype(np.float64) if v.dtype.kind == "f" else v
        for k, v in load_file(str(path)).items()
    }


def np_wordpiece_ids(tokenizer_json, texts, max_len):
    """Our intended tokenizer semantics, written with the tokenizers library: padding and
    truncation in tokenizer.json switched off, [CLS] + first (max_len - 2) pieces + [SEP]."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.no_truncation()
    out = []
    for t in texts:
        ids = tok.encode(t).ids  # [CLS] ... [SEP]
        if len(ids) > max_len:
            ids = ids[:1] + ids[1:-1][: max_len - 2] + ids[-1:]
        out.append(ids)
    return out


def np_st_vectors(w, cfg, id_rows, gelu_approx=False):
    out = []
    for ids in id_rows:
        hs = np_bert(w, ids, cfg, gelu_approx)
        v = hs.mean(0)
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


# --------------------------------------------------------------------------------------------
# a) tiny BERT
# --------------------------------------------------------------------------------------------


def build_tiny_tokenizer(train_texts):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(
        models.WordPiece(
            unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100
        )
    )
    # Same settings as MiniLM's tokenizer.json: strip_accents null + lowercase true (which
    # strips accents, as BERT's uncased tokenizer does).
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=600,
        min_frequency=2,
        special_tokens=TINY_SPECIALS,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(train_texts, trainer=trainer)
    # The trainer's id order varies from run to run (hash-map order); the set of pieces does
    # not. Re-number canonically so reruns write byte-identical fixtures: specials first, then
    # by piece length, word-initial before "##" continuation, then alphabetically.
    trained = tok.get_vocab()
    rest = sorted(
        (t for t in trained if t not in TINY_SPECIALS),
        key=lambda t: (len(t[2:]) if t.startswith("##") else len(t), t.startswith("##"), t),
    )
    vocab = {t: i for i, t in enumerate(TINY_SPECIALS + rest)}
    tok.model = models.WordPiece(
        vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    # Trap for careless loaders (MiniLM ships 128/128 switched on): padding and truncation ON.
    tok.enable_truncation(max_length=16)
    tok.enable_padding(
        direction="right",
        pad_id=tok.token_to_id("[PAD]"),
        pad_type_id=0,
        pad_token="[PAD]",
        length=16,
    )
    return tok


def build_tiny_bert(out_dir: Path, data: Data):
    import sentence_transformers
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tok = build_tiny_tokenizer(data.training_texts())
    tok.save(str(out_dir / "tokenizer.json"))

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        pad_token_id=0,
        # Large init so attention is far from uniform and gelu is far from linear: the
        # fixture then tells apart masking mistakes and gelu variants.
        initializer_range=0.2,
    )
    model = BertModel(config)  # with pooler, like MiniLM's checkpoint
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Non-trivial LayerNorm gains/biases and linear biases so that a loader that
            # drops or swaps them is caught.
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    model.eval()
    try:
        model.save_pretrained(str(out_dir), safe_serialization=True)
    except TypeError:  # newer transformers always write safetensors
        model.save_pretrained(str(out_dir))
    assert (out_dir / "model.safetensors").exists()
    os.chmod(out_dir / "model.safetensors", 0o644)  # transformers writes it 0600

    # The rest of a sentence-transformers folder, in the same format as MiniLM's.
    (out_dir / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ],
            indent=2,
        )
    )
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": TINY_MAX_SEQ, "do_lower_case": False}, indent=2)
    )
    (out_dir / "1_Pooling").mkdir()
    (out_dir / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": config.hidden_size,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            indent=2,
        )
    )
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "do_lower_case": True,
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
                "tokenize_chinese_chars": True,
                "strip_accents": None,
                "tokenizer_class": "BertTokenizer",
                "model_max_length": 512,
            }
        )
    )
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "unk_token": "[UNK]",
                "sep_token": "[SEP]",
                "pad_token": "[PAD]",
                "cls_token": "[CLS]",
                "mask_token": "[MASK]",
            }
        )
    )
    (out_dir / "config_sentence_transformers.json").write_text(
        json.dumps(
            {
                "__version__": {
                    "sentence_transformers": sentence_transformers.__version__,
                    "transformers": transformers.__version__,
                    "pytorch": torch.__version__,
                }
            },
            indent=2,
        )
    )
    return out_dir


def make_tiny_fixture(out: Path, data: Data):
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel

    tiny_dir = build_tiny_bert(out / "tiny_bert", data)
    texts = [data.get(s) for s in TINY_SOURCES]

    st = SentenceTransformer(str(tiny_dir), device="cpu")
    assert st.max_seq_length == TINY_MAX_SEQ, st.max_seq_length
    st_vectors, st_rows, facts, _ = st_encode_with_ids(st, texts, "tiny_bert")

    hf_tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    enc = hf_tok(texts, truncation=True, max_length=TINY_MAX_SEQ, padding=True, return_tensors="pt")
    hf_rows = [
        row[m.bool()].tolist()
        for row, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)
    ]
    assert hf_rows == st_rows, "AutoTokenizer and sentence-transformers disagree"
    model = BertModel.from_pretrained(str(tiny_dir)).eval()
    with torch.no_grad():
        hs = model(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            token_type_ids=torch.zeros_like(enc["input_ids"]),
        ).last_hidden_state
    cls_vectors = hs[:, 0].numpy().astype(np.float32)

    # numpy check
    cfg = json.loads((tiny_dir / "config.json").read_text())
    w = np_load_safetensors(tiny_dir / "model.safetensors")
    np_rows = np_wordpiece_ids(tiny_dir / "tokenizer.json", texts, TINY_MAX_SEQ)
    assert np_rows == st_rows, "our tokenizer semantics differ from sentence-transformers"
    np_st = np_st_vectors(w, cfg, np_rows)
    np_cls = np.stack([np_bert(w, ids, cfg)[0] for ids in np_rows])
    np_st_tanh = np_st_vectors(w, cfg, np_rows, gelu_approx=True)
    print(
        f"[tiny_bert] numpy vs ST st_vectors max abs diff {np.abs(np_st - st_vectors).max():.2e}; "
        f"numpy vs HF cls_vectors {np.abs(np_cls - cls_vectors).max():.2e}; "
        f"(numpy with tanh-gelu vs ST: {np.abs(np_st_tanh - st_vectors).max():.2e})"
    )
    lens = [len(r) for r in st_rows]
    unk_id = json.loads((tiny_dir / "tokenizer.json").read_text())["model"]["vocab"]["[UNK]"]
    unk = sum(r.count(unk_id) for r in st_rows)
    print(f"[tiny_bert] vocab {cfg['vocab_size']}, token counts {lens}, [UNK]s {unk}")

    path = out / "tiny_bert_reference.npz"
    np.savez_compressed(
        path,
        texts=np.array(texts),
        sources=np.array(TINY_SOURCES),
        st_vectors=st_vectors,
        cls_vectors=cls_vectors,
        token_ids=pad_ids(st_rows),
        max_seq_length=np.int32(TINY_MAX_SEQ),
    )
    return {
        "st_diff": float(np.abs(np_st - st_vectors).max()),
        "cls_diff": float(np.abs(np_cls - cls_vectors).max()),
        "tanh_diff": float(np.abs(np_st_tanh - st_vectors).max()),
        "keys": sorted(w),
        "facts": facts,
    }


# --------------------------------------------------------------------------------------------
# c) MiniLM
# --------------------------------------------------------------------------------------------


def loadable_st_dir(src: Path, tmp: Path) -> Path:
    """Return src if every module folder named in modules.json exists, else a temp mirror of
    it (symlinked files) with the missing, parameter-free module folders created empty."""
    modules = json.loads((src / "modules.json").read_text())
    missing = [m["path"] for m in modules if m["path"] and not (src / m["path"]).exists()]
    if not missing:
        return src
    dst = tmp / src.name
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).symlink_to(p.resolve())
    for m in missing:
        (dst / m).mkdir(parents=True)
    print(f"[minilm] modules.json names missing folders {missing}: loading from a mirror {dst}")
    return dst


def make_minilm_fixture(out: Path, data: Data, minilm_dir: Path):
    from sentence_transformers import SentenceTransformer

    texts = [data.get(s) for s in MINILM_SOURCES]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            st = SentenceTransformer(str(minilm_dir), device="cpu")
        except Exception as e:  # pragma: no cover - depends on the installed version
            print(f"[minilm] direct load failed ({e!r}); retrying from a mirror")
            st = SentenceTransformer(str(loadable_st_dir(minilm_dir, Path(tmp))), device="cpu")
        print(
            f"[minilm] modules: {[type(m).__name__ for m in st]}; "
            f"max_seq_length {st.max_seq_length}"
        )
        max_len = st.max_seq_length
        st_vectors, st_rows, facts, dt = st_encode_with_ids(st, texts, "minilm")
        t0 = time.perf_counter()
        st.encode(texts, convert_to_numpy=True)
        dt2 = time.perf_counter() - t0
        print(f"[minilm] second (warm) encode of the same texts: {dt2:.3f}s")

    cfg = json.loads((minilm_dir / "config.json").read_text())
    w = np_load_safetensors(minilm_dir / "model.safetensors")
    np_rows = np_wordpiece_ids(minilm_dir / "tokenizer.json", texts, max_len)
    assert np_rows == st_rows, "our tokenizer semantics differ from sentence-transformers"
    np_st = np_st_vectors(w, cfg, np_rows)
    np_st_tanh = np_st_vectors(w, cfg, np_rows, gelu_approx=True)
    diff = float(np.abs(np_st - st_vectors).max())
    print(
        f"[minilm] numpy vs ST st_vectors max abs diff {diff:.2e} "
        f"(numpy with tanh-gelu vs ST: {np.abs(np_st_tanh - st_vectors).max():.2e}); "
        f"token counts {[len(r) for r in st_rows]}"
    )
    path = out / "minilm_reference.npz"
    np.savez_compressed(
        path,
        texts=np.array(texts),
        sources=np.array(MINILM_SOURCES),
        st_vectors=st_vectors,
        token_ids=pad_ids(st_rows),
        max_seq_length=np.int32(max_len),
        model_sha256=np.array(sha256_file(minilm_dir / "model.safetensors")),
        tokenizer_sha256=np.array(sha256_file(minilm_dir / "tokenizer.json")),
    )
    return {
        "st_diff": diff,
        "tanh_diff": float(np.abs(np_st_tanh - st_vectors).max()),
        "encode_s": dt,
        "encode_warm_s": dt2,
        "facts": facts,
    }


# --------------------------------------------------------------------------------------------
# d) WordLlama
# --------------------------------------------------------------------------------------------


def make_wordllama_fixture(out: Path, data: Data, weights: Path, tokenizer_path: Path):
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference
    from wordllama.wordllama import WordLlama

    texts = [data.get(s).lower() for s in WORDLLAMA_SOURCES]

    # Exactly what WordLlama.load -> WordLlama._load does, minus locating/downloading files:
    # load_tokenizer() is Tokenizer.from_file(path); the weights are
    # safe_open(path, framework="np").get_tensor("embedding.weight") (no trunc_dim);
    # WordLlamaInference(embedding, tokenizer, binary=False) then casts the table to float32
    # and calls tokenizer.enable_padding() and tokenizer.no_truncation().
    tokenizer = WordLlama.load_tokenizer(Path(tokenizer_path))
    with safe_open(str(weights), framework="np", device="cpu") as f:
        keys = list(f.keys())
        embedding = f.get_tensor("embedding.weight")
    print(f"[wordllama] tensors {keys}; embedding.weight {embedding.shape} {embedding.dtype}")
    wl = WordLlamaInference(embedding, tokenizer, binary=False)
    vectors = np.asarray(wl.embed(texts, norm=True), dtype=np.float32)
    encs = wl.tokenize(texts)
    rows = [[i for i, m in zip(e.ids, e.attention_mask, strict=True) if m] for e in encs]
    print(f"[wordllama] padding {wl.tokenizer.padding}; truncation {wl.tokenizer.truncation}")

    # numpy check: plain tokenizer (no padding), float32 table, mean, L2 norm
    tok2 = Tokenizer.from_file(str(tokenizer_path))
    table = embedding.astype(np.float32)
    np_rows = [tok2.encode(t, add_special_tokens=False).ids for t in texts]
    assert np_rows == rows
    np_vecs = np.stack([table[r].astype(np.float64).mean(0) for r in np_rows])
    np_vecs /= np.linalg.norm(np_vecs, axis=1, keepdims=True)
    diff = float(np.abs(np_vecs - vectors).max())
    print(
        f"[wordllama] numpy vs package max abs diff {diff:.2e}; "
        f"token counts {[len(r) for r in rows]}"
    )

    # Cross-check against the package's own WordLlama.load, offline: it looks for
    # <cache_dir>/weights/l2_supercat_256.safetensors and
    # <cache_dir>/tokenizers/l2_supercat_tokenizer_config.json (its look-up in the package
    # folder uses "tokenizer/", not "tokenizers/", so an installed wheel alone misses it).
    load_diff = None
    with tempfile.TemporaryDirectory() as cache:
        (Path(cache) / "weights").mkdir()
        (Path(cache) / "tokenizers").mkdir()
        (Path(cache) / "weights" / "l2_supercat_256.safetensors").symlink_to(
            Path(weights).resolve()
        )
        (Path(cache) / "tokenizers" / "l2_supercat_tokenizer_config.json").symlink_to(
            Path(tokenizer_path).resolve()
        )
        try:
            wl2 = WordLlama.load("l2_supercat", dim=256, cache_dir=cache, disable_download=True)
            load_diff = float(np.abs(wl2.embed(texts, norm=True) - vectors).max())
            print(
                "[wordllama] WordLlama.load(cache_dir=<mirror>, disable_download=True) "
                f"vs constructed: {load_diff:.2e}"
            )
        except Exception as e:
            print(f"[wordllama] WordLlama.load failed offline ({e!r}); cross-check skipped")

    path = out / "wordllama_reference.npz"
    np.savez_compressed(
        path,
        texts=np.array(texts),
        sources=np.array(WORDLLAMA_SOURCES),
        vectors=vectors,
        token_ids=pad_ids(rows),
        weights_sha256=np.array(sha256_file(weights)),
        tokenizer_sha256=np.array(sha256_file(tokenizer_path)),
    )
    return {"diff": diff, "load_diff": load_diff}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minilm_dir", type=Path, default=Path("/tmp/pretrained/all-MiniLM-L6-v2"))
    ap.add_argument(
        "--wordllama_weights",
        type=Path,
        default=Path("/tmp/pretrained/wl_src/wordllama/weights/l2_supercat_256.safetensors"),
    )
    ap.add_argument(
        "--wordllama_tokenizer",
        type=Path,
        default=Path("/tmp/pretrained/wl_src/wordllama/tokenizers/l2_supercat_tokenizer_config.json"),
    )
    ap.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "pretrained")
    ap.add_argument("--only", choices=["tiny", "minilm", "wordllama"], action="append",
                    help="make only these fixtures (repeatable); default all")
    args = ap.parse_args(argv)
    out = args.out if args.out.is_absolute() else (Path.cwd() / args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Data(args.data)
    only = set(args.only or ["tiny", "minilm", "wordllama"])

    import torch

    torch.manual_seed(0)
    results = {}
    if "tiny" in only:
        results["tiny"] = make_tiny_fixture(out, data)
    if "minilm" in only:
        results["minilm"] = make_minilm_fixture(out, data, args.minilm_dir)
    if "wordllama" in only:
        results["wordllama"] = make_wordllama_fixture(
            out, data, args.wordllama_weights, args.wordllama_tokenizer
        )

    print("\nfixtures:")
    for p in sorted(out.iterdir()):
        size = folder_size(p) if p.is_dir() else p.stat().st_size
        print(f"  {p.relative_to(out)}{'/' if p.is_dir() else ''}  {size:,} bytes")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
