"""Distill: train the student to reproduce the teacher's projected embeddings (HPD), then export it.

Split the way sentence-transformers splits its trainer, which takes the training steps: the parameters
(``DistillParams`` in :mod:`tasks.stages.params`), the training data (:mod:`.data`) and its batch order
(:mod:`.sampler`), the loss (:mod:`.objective`), the run (:mod:`.trainer`), the trainer it drives
(:mod:`.st_trainer`) and its optimisation (:mod:`.optimization`), the processes (:mod:`.distributed`),
checkpoints and the state they carry (:mod:`.checkpoints`, :mod:`.state`), the export with its model card
(:mod:`.export`), and the stage that ties them to the store (:mod:`.stage`).

Output: ``students/<name>/<fp12>/model/`` (a sentence-transformers folder with a model card),
``losses.jsonl`` and ``metrics.json``, with a manifest. A rerun with the same inputs and params
resumes from the latest checkpoint and continues the same run.
"""

from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.stage import run
from tasks.stages.distill.trainer import DistillError, Trainer
from tasks.stages.params import DistillParams

__all__ = ["DistillError", "DistillParams", "Distributed", "Trainer", "run"]
