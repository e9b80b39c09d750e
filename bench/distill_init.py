"""Dense-head initialisation: where each choice starts, before any training step.

On the data of ``bench/distill_quality`` (prepared by it, or here if missing): for all-MiniLM-L6-v2
and its 3-layer cut, the validation MSE and mean cosine to the projected teacher targets right after
initialising the head with ``random`` (HPD's choice), ``pca`` (the student's own principal components,
scaled to the targets' spread) and ``ridge`` (closed-form fit on 4,096 training rows, the default).
What training makes of the ridge start is in ``distill_quality.json``.
"""

from __future__ import annotations

from bench import distill_quality, results
from tasks.core import config
from tasks.ml import models
from tasks.stages import distill
from tasks.stages.distill.data import TrainingData, shard_pairs

INITS = ("random", "pca", "ridge")


def main() -> dict:
    import torch

    torch.set_num_threads(distill_quality.THREADS)
    distill_quality.prepare()
    store = distill_quality.STORE
    data = TrainingData(shard_pairs(store, models.DEFAULT_TEACHER, "k128-uncentered"), 0, 0.02, 2000)
    measured: dict[str, dict] = {}
    for layers in (None, 3):
        for init in INITS:
            params = config.parse(
                distill.DistillParams,
                {"store": store, "init": init, "student_layers": layers, "threads": distill_quality.THREADS},
            )
            trainer = distill.Trainer(params, data, "cpu", distill.Distributed(), f"init-probe-{init}")
            trainer.restore_or_initialise(force=True)
            measured[f"MiniLM-L{layers or 6} {init}"] = trainer.state.evals[0]
    ridge, random_head = measured["MiniLM-L6 ridge"], measured["MiniLM-L6 random"]
    return results.write(
        "distill_init",
        unit="validation cosine at step 0",
        ours=round(ridge["val_cosine"], 4),
        baseline=round(random_head["val_cosine"], 4),
        baseline_name="random head (HPD's init)",
        higher_is_better=True,
        details={"student": "all-MiniLM-L6-v2", "by_init": measured, "val_rows": len(data.val_texts)},
    )


if __name__ == "__main__":
    print(main())
