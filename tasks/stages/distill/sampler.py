"""The order sentence-transformers' trainer takes a distillation run's rows in: each epoch's seeded order
(:meth:`.data.TrainingData.epoch_order`) cut into micro-batches, the ones of a process handed out by accelerate.

A global batch of ``batch_size`` rows is ``grad_accum`` micro-batches of ``batch_size / (grad_accum * world)``
rows on each of ``world`` processes; accelerate gives process r the micro-batches r, r + world, ... so each
process trains on the contiguous slice of each micro-batch its rank took in the loop this replaced.
With ``drop_last`` (which sentence-transformers forces under DDP: uneven shards would hang), only full
micro-batches are kept, as many as make whole rounds over the processes: an epoch's tail is not trained.
The run tells the sampler its epoch (``Order.epoch_of``): on a resume under DDP the trainer's ``set_epoch`` does
not reach a sampler wrapped by both accelerate's shard and the skip of the rows already trained.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sentence_transformers.base.sampler import DefaultBatchSampler

from tasks.stages.distill.data import TrainingData


@dataclass(frozen=True)
class Order:
    """Whose order a sampler follows: ``data``'s, for global batches of ``global_batch`` rows (``grouped``: of
    like lengths), over ``world`` processes."""

    data: TrainingData
    global_batch: int
    grouped: bool = False
    world: int = 1
    epoch_of: Callable[[], int] | None = None  # the epoch being trained, when the run knows it better than set_epoch


class HPDBatchSampler(DefaultBatchSampler):
    """Micro-batches of ``batch_size`` rows (per process) in ``order``; built by sentence-transformers' trainer
    (``SentenceTransformerTrainingArguments(batch_sampler=functools.partial(HPDBatchSampler, order=...))``)."""

    def __init__(self, dataset: Any, batch_size: int, drop_last: bool, *, order: Order, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size, drop_last, **kwargs)
        self.order = order

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order
        epoch = order.epoch_of() if order.epoch_of is not None else self.epoch
        rows = order.data.epoch_order(epoch, order.global_batch, order.grouped)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield rows[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        return micro_batches(self.order.data.train_rows, self.batch_size, self.order.world, self.drop_last)


def micro_batches(rows: int, size: int, world: int, drop_last: bool) -> int:
    """Micro-batches of ``size`` an epoch of ``rows`` is cut into, over all processes; with ``drop_last``
    full ones only, in whole rounds over the ``world`` processes."""
    if not drop_last:
        return -(-rows // size)
    return rows // size // world * world
