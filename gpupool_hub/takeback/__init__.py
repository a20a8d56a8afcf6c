"""When the pool takes GPUs back: from a user out of tokens (``cull``) or from an idle server while
others wait (``idle``). Pure rules; the service's jobs carry them out (``service/jobs/cull.py``,
``service/jobs/idle.py``)."""
