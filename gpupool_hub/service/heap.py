"""What start-up built, kept out of the garbage collector's full passes.

Python's cyclic collector walks every container object it tracks on each full
(generation 2) pass. Once restored at 100k users the service holds about 225,000
of them (the pool's 10,000 GPUs, the 5,915 held allocations and their placements,
the 2,000 waiters, every imported module's functions), and on the 2-core test
machine one full pass over them took 300-390 ms: a stall of every request and
job, since the pass holds the interpreter. In a busy minute (an hourly debit's
10,000 postings, the cull) such passes came every few seconds.

Those objects live as long as the process, so once start-up is done they are
moved to the collector's permanent generation (``gc.freeze``) and later passes
walk only what came after. Their memory is still freed when nothing refers to
them; only a reference cycle among them that becomes garbage would stay, and
start-up builds each of them once.
"""

from __future__ import annotations

import gc


def keep_start_up_heap() -> int:
    """Collect once, then freeze what is left; how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
