"""Foundations every layer may use: file writes, the cache folder, run-folder names, distributed helpers.

Nothing here imports from the rest of ``zoo`` (tests/test_layers.py checks).
"""
