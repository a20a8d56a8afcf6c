"""``python -m gpupool_hub.agent``: run the node agent."""

from .app import main

if __name__ == "__main__":
    main()
