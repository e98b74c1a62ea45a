"""Ordered consumers: checkpointed, exclusively owned, in-order processing of an
append-only table (see docs/consumers.md).

- ``consumer``: the ``Consumer`` base class users subclass, and the ``Batch`` its
  ``handle_batch`` may take (the fencing token);
- ``models``: the checkpoints and the gap-skip audit;
- ``frontier``: how far a window lets a consumer advance (gaps), pure logic;
- ``batch``: one batch, in the transaction that moves the checkpoint;
- ``assignment``: the leader's deterministic assignment of consumers to workers;
- ``runner``: the threads that run a worker's consumers beside its lanes;
- ``status``: lag and state against the table's head, for the command, admin, metrics.
"""

from .consumer import Batch, Consumer

__all__ = ["Batch", "Consumer"]
