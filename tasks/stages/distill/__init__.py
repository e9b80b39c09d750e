"""Distill: train the student to reproduce the teacher's projected embeddings (HPD), then export it.

Split the way sentence-transformers splits its trainer, which takes the training steps: the parameters
(``DistillParams`` in :mod:`tasks.stages.params`), the training data (:mod:`.data`) and its batch order
(:mod:`.sampler`), the loss (:mod:`.objective`), the plan of steps (:mod:`.plan`), the run (:mod:`.trainer`),
sentence-transformers' trainer that owns the loop (:mod:`.st_trainer`) with the run's evaluator
(:mod:`.evaluation`) and callbacks (:mod:`.callbacks`), its optimisation (:mod:`.optimization`), the weights it
keeps and blends (:mod:`.weights`, :mod:`.blending`), its log (:mod:`.run_log`), the processes
(:mod:`.distributed`), checkpoints and the state they carry (:mod:`.checkpoints`, :mod:`.state`), the export
(:mod:`.export`) with its model card (:mod:`.card`), and the stage that ties them to the store (:mod:`.stage`).

Output: ``students/<name>/<fp12>/model/`` (a sentence-transformers folder with a model card),
``losses.jsonl`` and ``metrics.json``, with a manifest. A rerun with the same inputs and params
resumes from the latest checkpoint and continues the same run.
"""

from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.stage import run
from tasks.stages.distill.trainer import Trainer
from tasks.stages.params import DistillParams

__all__ = ["DistillError", "DistillParams", "Distributed", "Trainer", "run"]
