"""The config: its validation, its resolution into typed specs, its keys' documentation."""
