"""Make the MPNet reference fixtures (the MPNet side of make_pretrained_fixtures.py).

Writes, under --out (default tests/fixtures/pretrained):

  tiny_mpnet/               a tiny random MPNet (hidden 32, 2 layers, 4 heads, intermediate
                            37, 66 positions (64 + MPNet's padding offset of 2), 32 relative
                            buckets; the tiny BERT's WordPiece pieces under MPNet's special
                            tokens <s> <pad> </s> [UNK] <mask>) saved as a complete
                            sentence-transformers folder in all-mpnet-base-v2's layout
                            (max_seq_length 60, mean pooling, Normalize). Its tokenizer.json
                            has padding and truncation at 16 switched on, a trap for loaders.
  tiny_mpnet_reference.npz  texts, sources, st_vectors [n, 32] (SentenceTransformer.encode),
                            token_ids [n, max_len] padded with -1, max_seq_length, and
                            buckets [300, 300] int8: transformers' MPNet relative-position
                            bucket of (key - query) for 300 positions (past the 128 where the
                            buckets saturate, which the tiny model never reaches).
  mpnet_reference.npz       texts, sources, st_vectors [n, 768] from
                            SentenceTransformer(all-mpnet-base-v2) (max_seq_length 384),
                            token_ids padded with -1, model_sha256, tokenizer_sha256.

torch, transformers and sentence-transformers are not dualjax's dependencies: run it in a
virtualenv that has them (see make_pretrained_fixtures.py), from the repository root:

    python scripts/make_mpnet_fixtures.py \\
        --mpnet_dir ~/.cache/dualjax/pretrained/all-mpnet-base-v2 --data ../shared/data

The committed fixtures were made with torch 2.13.0+cpu, transformers 5.24.0,
sentence-transformers 6.2.0 and tokenizers 0.23.x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_pretrained_fixtures import (  # noqa: E402
    MINILM_SOURCES,
    REPO_ROOT,
    TINY_SOURCES,
    Data,
    pad_ids,
    sha256_file,
    st_encode_with_ids,
)

TINY_MAX_SEQ = 60
# The tiny BERT's first five pieces, renamed in MPNet's order (<s> 0, <pad> 1, </s> 2).
MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
LONG_SOURCES = ["npl/d/3334", "squad/p/Ctenophora/0"]  # longer than 60 pieces: cut


def tiny_tokenizer(bert_tokenizer: Path):
    """The tiny BERT's WordPiece vocabulary with MPNet's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = json.loads(bert_tokenizer.read_text())["model"]["vocab"]
    pieces = sorted(vocab, key=vocab.get)
    pieces[:len(MPNET_SPECIALS)] = MPNET_SPECIALS
    tok = Tokenizer(models.WordPiece(vocab={p: i for i, p in enumerate(pieces)},
                                     unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(MPNET_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.enable_truncation(max_length=16)
    tok.enable_padding(direction="right", pad_id=1, pad_token="<pad>", length=16)
    return tok


def build_tiny_mpnet(out_dir: Path) -> Path:
    import sentence_transformers
    import torch
    import transformers
    from transformers import MPNetConfig, MPNetModel

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tok = tiny_tokenizer(out_dir.parent / "tiny_bert" / "tokenizer.json")
    tok.save(str(out_dir / "tokenizer.json"))
    torch.manual_seed(0)
    config = MPNetConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=37,
                         max_position_embeddings=TINY_MAX_SEQ + 6,
                         relative_attention_num_buckets=32, layer_norm_eps=1e-5,
                         pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         initializer_range=0.2)
    model = MPNetModel(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Gains, biases and a relative bias far from their defaults, so that a loader
            # that drops or swaps one is caught.
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "relative_attention_bias" in name:
                p.copy_(2.0 * torch.randn(p.shape, generator=gen))
    model.eval()
    model.save_pretrained(str(out_dir))
    os.chmod(out_dir / "model.safetensors", 0o644)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": TINY_MAX_SEQ, "do_lower_case": False}, indent=2))
    (out_dir / "1_Pooling").mkdir()
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
         "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
         "cls_token": "<s>", "unk_token": "[UNK]", "pad_token": "<pad>",
         "mask_token": "<mask>", "tokenize_chinese_chars": True, "strip_accents": None,
         "model_max_length": 512, "tokenizer_class": "MPNetTokenizer"}))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]", "sep_token": "</s>",
         "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"}))
    (out_dir / "config_sentence_transformers.json").write_text(json.dumps(
        {"__version__": {"sentence_transformers": sentence_transformers.__version__,
                         "transformers": transformers.__version__,
                         "pytorch": torch.__version__}}, indent=2))
    return out_dir


def torch_buckets(length: int) -> np.ndarray:
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    return MPNetEncoder.relative_position_bucket(relative, num_buckets=32).numpy()


def make_tiny(out: Path, data: Data) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_tiny_mpnet(out / "tiny_mpnet")
    sources = TINY_SOURCES + LONG_SOURCES
    texts = [data.get(s) for s in sources]
    st = SentenceTransformer(str(folder), device="cpu")
    assert st.max_seq_length == TINY_MAX_SEQ, st.max_seq_length
    vectors, rows, facts, _ = st_encode_with_ids(st, texts, "tiny_mpnet")
    print(f"[tiny_mpnet] token counts {[len(r) for r in rows]}; {facts}")
    np.savez_compressed(out / "tiny_mpnet_reference.npz", texts=np.array(texts),
                        sources=np.array(sources), st_vectors=vectors,
                        token_ids=pad_ids(rows), max_seq_length=np.int32(TINY_MAX_SEQ),
                        buckets=torch_buckets(300).astype(np.int8))


def make_real(out: Path, data: Data, mpnet_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = [data.get(s) for s in MINILM_SOURCES]
    st = SentenceTransformer(str(mpnet_dir), device="cpu")
    print(f"[mpnet] modules {[type(m).__name__ for m in st]}; max_seq_length "
          f"{st.max_seq_length}")
    vectors, rows, _, _ = st_encode_with_ids(st, texts, "mpnet")
    print(f"[mpnet] token counts {[len(r) for r in rows]}")
    np.savez_compressed(out / "mpnet_reference.npz", texts=np.array(texts),
                        sources=np.array(MINILM_SOURCES), st_vectors=vectors,
                        token_ids=pad_ids(rows), max_seq_length=np.int32(st.max_seq_length),
                        model_sha256=sha256_file(mpnet_dir / "model.safetensors"),
                        tokenizer_sha256=sha256_file(mpnet_dir / "tokenizer.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mpnet_dir", type=Path, default=Path.home() / ".cache" / "dualjax" /
                    "pretrained" / "all-mpnet-base-v2")
    ap.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "pretrained")
    args = ap.parse_args()
    data = Data(args.data)
    make_tiny(args.out, data)
    make_real(args.out, data, args.mpnet_dir)


if __name__ == "__main__":
    main()
