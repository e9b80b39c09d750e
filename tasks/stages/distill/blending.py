"""Blending the final weights with the initial ones (``blend_initial``), a checkpoint-averaging lever.

After training, each fraction ``a`` of ``blend_initial`` gives the weights ``(1 - a) * initial + a * final``
(the initial weights: the base model with its initialised head, as evaluated at step 0; the final ones: those
training ended with), as WiSE-FT interpolates a pretrained model with its fine-tuned self: a student that
learns the targets can forget what its base model knew, and the line between them often scores above both
ends. Each blend is scored as an evaluation is (the same validation, the same ``select_on`` criterion), and
a blend is exported only when it scores strictly better than the best weights (which may be the initial
ones): :func:`export_choice`.
"""

from __future__ import annotations

from typing import Any

from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.evaluation import Evaluation, FidelityEvaluator
from tasks.stages.distill.run_log import RunLog
from tasks.stages.distill.state import TrainState
from tasks.stages.distill.weights import KeptWeights


def choose(best: Evaluation, blends: list[Evaluation], select_on: str) -> Evaluation | None:
    """The blend evaluation (of ``blends``) to export instead of the best weights' evaluation ``best``: the
    best-scoring blend by ``select_on`` when it scores strictly better than ``best``; None otherwise (a tie
    keeps the best weights). Among equally scoring blends, the first."""
    if not blends:
        return None
    winner = min(blends, key=lambda evaluation: evaluation.score(select_on))
    return winner if winner.score(select_on) < best.score(select_on) else None


def export_choice(
    kept: KeptWeights, evaluator: FidelityEvaluator, view: Any, state: TrainState, dist: Distributed, run_log: RunLog
) -> dict[str, Any]:
    """Score the best weights (loaded) and, when blending, each blend of the initial and final weights; load the
    weights to export (a blend only when it scores better by ``select_on``) and return their record: the best
    weights' evaluation, with ``blend`` (the chosen fraction, or None) and ``blends`` (every blend's evaluation)
    when blending. Every process exports the leader's choice. ``view``: the model's ``SentenceTransformer``."""
    best = evaluator.evaluate(view, state.best_step)
    if kept.initial is None or kept.final is None:
        run_log.scores("exporting the weights of", best)
        return best.as_record()
    blends = []
    for a in run_log.params.blend_initial:
        kept.load(kept.blend(a))
        blends.append(evaluator.evaluate(view, state.step).at(state.step, a))
        run_log.scores(f"blend {a:g} of the initial weights and those of", blends[-1])
    select_on = run_log.params.select_on
    chosen, blends = dist.gather((choose(best, blends, select_on), blends))[0]
    records = [evaluation.as_record() for evaluation in blends]
    if chosen is None or chosen.blend is None:
        kept.load(kept.best)
        run_log.scores(f"no blend beats the best weights by {select_on}; exporting the weights of", best)
        return {**best.as_record(), "blend": None, "blends": records}
    a = chosen.blend
    kept.load(kept.blend(a))
    what = f"blend {a:g} beats the best weights by {select_on}; exporting the initial weights blended {a:g} toward"
    run_log.scores(f"{what} those of", chosen)
    return {**chosen.as_record(), "blends": records}
