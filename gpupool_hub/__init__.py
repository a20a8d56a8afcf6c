"""gpupool_hub: a GPU pool manager for JupyterHub."""

__version__ = "0.1.0.dev0"
