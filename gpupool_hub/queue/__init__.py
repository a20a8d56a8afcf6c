"""The wait queue's pure rules, in one package: who waits in which order (``order``), who starts
when GPUs free (``dispatch``), and how long each waiter is told it will wait (``estimates``, from
the pool's history; ``flow``, the rate it is served at and those who join ahead; ``forecast``, what
the held servers will free as they age; ``calibration``, the past misses). No I/O: the service's
queue unit (``service/core/queue*.py``) holds the state and calls these rules, the replay
(``benchmarks/replay_openb.py``) runs them on a trace.
"""
