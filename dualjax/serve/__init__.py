"""Serving: the exported encoder bundle."""
