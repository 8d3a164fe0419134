"""Benchmarks (``python -m skulk.bench …``): always ratios against a baseline in the same run."""
