"""The local engine: each server a process on the hub's machine (``engines/local/spawner.py``)."""

from .. import Engine

ENGINE = Engine("local", spawners=("gpupool-localprocess", "gpupool-simple", "GPUPoolLocalProcessSpawner",
                                   "GPUPoolSimpleSpawner"))
