"""What a distillation run publishes: the sentence-transformers folder with its model card (:mod:`.card`), the
loss history and the metrics."""

from __future__ import annotations

import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

from tasks.core import catalog, manifest, storage
from tasks.ml import onnx_encoder
from tasks.ml.student import MODEL_FOLDER
from tasks.stages import tracking
from tasks.stages.distill import card
from tasks.stages.distill.trainer import Trainer


def run_summary(trainer: Trainer, init_record: dict[str, Any]) -> dict[str, Any]:
    """The run's stats: steps, rows, validation before / at the end / of the exported weights, set-up."""
    state = trainer.state
    return {
        "steps": state.step,
        "total_steps": trainer.plan.total_steps,
        "train_rows": trainer.data.train_rows,
        "val_rows": len(trainer.data.val_texts),
        "k": trainer.data.dim,
        "best_step": state.best_step,
        "best_val_mse": state.best_val_mse,
        "initial": state.evals[0].as_record() if state.evals else None,
        "final": state.evals[-1].as_record() if state.evals else None,
        "exported": trainer.exported,
        "stopped_early": state.stopped_early,
        "init": init_record,
        "exports_its_start": exports_its_start(trainer),
        "amp": trainer.plan.amp,
        "world_size": trainer.dist.world,
    }


def exports_its_start(trainer: Trainer) -> bool:
    """Whether the exported weights are the warm start's own: its head was kept, and no trained checkpoint or blend
    scored above step 0 (a retrain with nothing better to promote)."""
    exported, head = trainer.exported or {}, trainer.init_record.get("init")  # as step 0 was (a resumed run's too)
    return head == "warm_start" and trainer.state.best_step == 0 and exported.get("blend") is None


def files(trainer: Trainer, stage_run: manifest.StageRun, summary: dict[str, Any]) -> dict[str, bytes]:
    """The exported model folder (with model card, and the ONNX graph ``params.onnx`` asks for, whose record
    joins ``summary``), loss history and metrics, as URI -> bytes."""
    # A folder per run: a later run under the same name (with any flags) never overwrites what a manifest lists.
    prefix = catalog.student_prefix(stage_run.store, trainer.params.name, stage_run.run_id)
    exported: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / MODEL_FOLDER
        trainer.model.require_finite_weights(f"distill {trainer.params.name}: the weights to export")
        trainer.model.save(folder)
        without_pooler(folder, trainer.model.transformer)
        onnx: onnx_encoder.OnnxExport | None = None
        if trainer.params.onnx != "none":
            onnx = onnx_encoder.export(trainer.model, folder, trainer.params.onnx)
            summary["onnx"] = onnx.as_record()
        learned = [str(day) for day in summary.get("learned_partitions") or ()]
        (folder / "README.md").write_text(card.render(trainer, stage_run, onnx, learned))
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            exported[storage.join(prefix, MODEL_FOLDER, *path.relative_to(folder).parts)] = path.read_bytes()
    losses = "".join(json.dumps({"step": s, "loss": loss}) + "\n" for s, loss in trainer.state.losses)
    exported[storage.join(prefix, "losses.jsonl")] = losses.encode()
    metrics = {"evals": [evaluation.as_record() for evaluation in trainer.state.evals], **summary}
    exported[storage.join(prefix, "metrics.json")] = json.dumps(metrics, indent=2).encode()
    return exported


def without_pooler(folder: Path, transformer: Any) -> None:
    """Have sentence-transformers load the exported transformer without the pooler head the student dropped
    (unused by mean pooling, and not saved): ``add_pooling_layer: false`` in ``sentence_bert_config.json``'s
    model arguments, for the architectures that take it; otherwise loading warns that its weights are missing."""
    if getattr(transformer, "pooler", ()) is not None:
        return
    if "add_pooling_layer" not in inspect.signature(type(transformer).__init__).parameters:
        return
    path = folder / "sentence_bert_config.json"
    config = json.loads(path.read_text())
    config["model_args"] = {**config.get("model_args", {}), "add_pooling_layer": False}
    path.write_text(json.dumps(config))


def report(trainer: Trainer, stage_run: manifest.StageRun, manifest_uri: str) -> tracking.Report:
    """What the published run reports to experiment tracking: its parameters, the exported weights' scores and
    the run's size, the loss and validation histories by step, and where its manifest lies in the store."""
    state, data, scores = trainer.state, trainer.data, card.Scores.of(trainer)
    found, took = scores.exported, stage_run.timings_s.get("train")
    metrics = {
        "val_mse": found.val_mse,
        "val_cosine": found.val_cosine,
        **({} if found.sts_dev is None else {"sts_dev": found.sts_dev}),
        **({} if scores.training_loss is None else {"training_loss": scores.training_loss}),
        **({} if took is None else {"train_seconds": took}),
        "steps": state.step,
        "best_step": state.best_step,
        "train_rows": data.train_rows,
        "val_rows": len(data.val_texts),
        "k": data.dim,
    }
    history = {
        "loss": list(state.losses),
        "eval.val_mse": [(e.step, e.val_mse) for e in state.evals],
        "eval.val_cosine": [(e.step, e.val_cosine) for e in state.evals],
        "eval.sts_dev": [(e.step, e.sts_dev) for e in state.evals if e.sts_dev is not None],
    }
    return tracking.Report(
        stage="distill",
        name=trainer.params.name,
        params=tracking.params_of(trainer.params),
        metrics={name: float(value) for name, value in metrics.items()},
        history=history,
        tags=_tags(stage_run, manifest_uri),
    )


def _tags(stage_run: manifest.StageRun, manifest_uri: str) -> dict[str, str]:
    return {
        "hpd.run_id": stage_run.run_id,
        "hpd.manifest": catalog.store_key(stage_run.store, manifest_uri) or "",
        "hpd.code_version": manifest.code_version(),
    }
