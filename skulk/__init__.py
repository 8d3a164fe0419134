"""Skulk: a cluster fabric that turns several machines into one LLM-inference service."""

__version__ = "0.1.0"
