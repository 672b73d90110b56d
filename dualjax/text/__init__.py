"""Text -> token ids: normalisation, tokenizers, typos, categorical fields, per-side inputs."""
