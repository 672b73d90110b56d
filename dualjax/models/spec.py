"""What the models are built from: `ModelSpec`, the `model` config group resolved once
(`dualjax.config.specs.model_spec`), with the per-side towers named and the Transformer's preset
applied. A frozen dataclass, so a module holds it as a field and never reads a config."""

from __future__ import annotations

import dataclasses
from typing import Any

from dualjax.models.lora import LoraSpec


class Architecture:
    """A pretrained tower's sizes (a frozen dataclass: `BertConfig`, `DecoderConfig`,
    `ModernBertConfig`), saved with the run as JSON, its lists read back as tuples."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: dict) -> Any:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


TRANSFORMER_PRESETS: dict[str, dict[str, int]] = {
        "": {},  # the explicit model.transformer fields
        "bert_base": {"num_layers": 12, "width": 768, "num_heads": 12, "mlp_dim": 3072},
}
TRANSFORMER_POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class TransformerSpec:
    """The Transformer tower's sizes (model.transformer, its preset applied)."""
    num_layers: int = 2
    width: int = 128
    num_heads: int = 4
    mlp_dim: int = 512
    max_positions: int = 512
    pooling: str = "cls"
    init_std: float = 0.02

    @classmethod
    def make(cls, preset: str = "", **fields) -> TransformerSpec:
        """The fields with `preset`'s sizes over them; ValueError naming the key of a
        value that cannot work."""
        if preset not in TRANSFORMER_PRESETS:
            raise ValueError(f"model.transformer.preset={preset!r} is not one of: "
                             f"{', '.join(map(repr, TRANSFORMER_PRESETS))}")
        t = cls(**{**fields, **TRANSFORMER_PRESETS[preset]})
        if t.pooling not in TRANSFORMER_POOLINGS:
            raise ValueError(f"model.transformer.pooling={t.pooling!r} is not one of: "
                             f"{', '.join(TRANSFORMER_POOLINGS)}")
        for key in ("num_layers", "width", "num_heads", "mlp_dim", "max_positions", "init_std"):
            if getattr(t, key) <= 0:
                raise ValueError(f"model.transformer.{key}={getattr(t, key)} must be > 0")
        if t.width % t.num_heads:
            raise ValueError(f"model.transformer.width={t.width} must be divisible by "
                             f"model.transformer.num_heads={t.num_heads}")
        return t


@dataclasses.dataclass(frozen=True)
class PsesSpec:
    """PSES's encoders and decoders (model.pses)."""
    hidden_layers: int = 1
    hidden_dim: int = 256
    shared_dim: int = 128
    specific_dim: int = 64
    score: str = "concat"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model: which towers on each side, their sizes, and the similarity."""
    name: str = "dual_encoder"        # "dual_encoder" | "pses"
    query_tower: str = "bow_mlp"      # model.query_tower, else model.tower
    doc_tower: str = "bow_mlp"        # model.doc_tower, else model.tower
    shared_towers: bool = True
    shared_embedding: bool = False
    embed_dim: int = 128
    hidden_dim: int = 256
    output_dim: int = 128
    embed_init_std: float = 1.0
    cnn_windows: tuple[int, ...] = (5,)
    cnn_filters: int = 256
    dtype: str = "float32"            # the towers' activations (towers.DTYPES)
    remat: bool = False               # layers recomputed in the backward pass (model.remat)
    transformer: TransformerSpec = TransformerSpec()
    similarity: str = "cosine_affine"
    temperature: float = 0.1
    init_scale: float = 10.0
    init_bias: float = 0.0
    pses: PsesSpec = PsesSpec()
    lora: LoraSpec = LoraSpec()  # model.lora_*: adapters on the towers' projections
    # A registered tower's own settings (towers.register): (its name, ((key, value), ...)),
    # from the config group model.<its name>; dualjax's own towers read the fields above.
    tower_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def options_of(self, tower: str) -> dict[str, Any]:
        """The settings of tower `tower` (model.<tower>), as its factory's kwargs."""
        return dict(dict(self.tower_options).get(tower, ()))

    @property
    def towers(self) -> tuple[str, str]:
        """(query tower, document tower)."""
        return self.query_tower, self.doc_tower
