"""Flax towers and the dual encoder that composes them."""
