"""The local engine (see gpupool_hub/engines/__init__.py)."""
