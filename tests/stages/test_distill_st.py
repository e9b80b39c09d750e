"""What the distill stage relies on in sentence-transformers' trainer (pinned in requirements.lock): the
hooks :class:`DistillSTTrainer` overrides exist with the same parameters; a resume through a
``trainer_state.json`` alone, with those hooks, continues a run bit for bit; accelerate's shards of a batch
sampler give each process the rows our rank slicing gave it. An upgrade that breaks any fails here first."""

from __future__ import annotations

import copy
import inspect
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.sampler import DefaultBatchSampler
from transformers import TrainerCallback
from transformers.trainer_callback import TrainerState

from tasks.ml import student
from tasks.stages.distill.st_trainer import DistillSTArguments, DistillSTTrainer
from tasks.stages.distill.state import rng_states, seed_everything
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

ROWS, K, BATCH, STEPS = 40, 8, 4, 12  # 10 batches an epoch: a run of 12 steps crosses an epoch's end


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_sentence_model(tmp_path_factory.mktemp("st") / "student", normalize=False))


class _Order(DefaultBatchSampler):
    """A seeded order per epoch, as the stage's sampler gives."""

    def __iter__(self):
        order = np.random.default_rng([0, self.epoch]).permutation(len(self.sampler))
        yield from (order[i : i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size))

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)


class _Loss(torch.nn.Module):
    """Mean squared error; records each micro-batch's summed squared error."""

    def __init__(self, model):
        super().__init__()
        self.model, self.errors = model, []

    def forward(self, features, labels):
        out = self.model(features[0])["sentence_embedding"].float()
        sse = ((out - labels) ** 2).sum()
        self.errors.append(float(sse.detach()))
        return sse / out.numel()


class _StopAt(TrainerCallback):
    """Stops the run after step ``stop``, keeping what a checkpoint would carry in ``saved``."""

    def __init__(self, stop, encoder, optimizer, scheduler):
        self.stop, self.encoder, self.optimizer, self.scheduler, self.saved = stop, encoder, optimizer, scheduler, {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.stop:
            self.saved.update(
                model=copy.deepcopy(self.encoder.state_dict()),
                optimizer=copy.deepcopy(self.optimizer.state_dict()),
                scheduler=self.scheduler.state_dict(),
                rng=rng_states(),
                step=state.global_step,
            )
            control.should_training_stop = True


def _dataset():
    rows = np.random.default_rng(1)
    return Dataset.from_dict(
        {
            "sentence": [f"sentence number {i} " * (1 + i % 5) for i in range(ROWS)],
            "label": rows.uniform(-0.5, 0.5, (ROWS, K)).astype(np.float32).tolist(),
        }
    )


def _args(tmp_path: Path):
    return SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        batch_sampler=_Order,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )


def _run(tiny, tmp_path: Path, stop: int | None = None, payload: dict | None = None):
    """Train the tiny student for STEPS steps (stopping after ``stop``, or resuming ``payload``); returns its
    weights, per-micro-batch summed squared errors and, with ``stop``, what a checkpoint would carry."""
    seed_everything(0)
    encoder = student.build(tiny, K, "tanh", None, 64, 0.1, "cpu")  # dropout: the RNG matters
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (STEPS - s) / STEPS))
    if payload:
        encoder.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
    model = student.as_sentence_transformer(encoder)
    loss, stopper = _Loss(model), _StopAt(stop, encoder, optimizer, scheduler)
    trainer = DistillSTTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=_dataset(),
        loss=loss,
        callbacks=[stopper],
        optimizers=(optimizer, scheduler),
    )
    resume = None
    if payload:
        trainer.resume_rng, resume = payload["rng"], tmp_path / "resume"
        resume.mkdir()
        TrainerState(global_step=payload["step"], max_steps=STEPS, train_batch_size=BATCH).save_to_json(
            str(resume / "trainer_state.json")
        )
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return encoder.state_dict(), loss.errors, stopper.saved


@pytest.fixture(scope="module")
def straight(tiny, tmp_path_factory):
    """An unbroken run's weights and per-step errors."""
    logging.getLogger("transformers").setLevel(logging.WARNING)
    weights, errors, _ = _run(tiny, tmp_path_factory.mktemp("straight"))
    return weights, errors


@pytest.mark.parametrize("stop", [5, 10, 11], ids=["mid-epoch", "epoch-end", "next-epoch"])
def test_a_resume_from_a_trainer_state_alone_continues_bit_for_bit(tiny, straight, tmp_path, stop):
    straight, straight_errors = straight
    _, first_errors, payload = _run(tiny, tmp_path / "first", stop=stop)
    resumed, rest_errors, _ = _run(tiny, tmp_path / "resumed", payload=payload)
    assert len(first_errors) == stop and len(straight_errors) == STEPS
    assert first_errors + rest_errors == straight_errors
    assert all(torch.equal(straight[key], resumed[key]) for key in straight)


def test_shards_of_micro_batches_give_each_process_its_old_slice():
    """Rows 0..203, global batch 16 in 2 micro-batches over 2 processes: micro-batches of 4 handed out in turn
    are the contiguous rank slices of each micro-batch of 8 that the old loop cut."""
    from accelerate.data_loader import BatchSamplerShard

    rows, batch, accum, world = 204, 16, 2, 2
    micro = batch // (accum * world)
    batches = [list(range(i, min(i + micro, rows))) for i in range(0, rows, micro)]
    for rank in range(world):
        shard = list(BatchSamplerShard(batches, world, rank, split_batches=False, even_batches=False))
        for step in range(rows // batch):
            for j in range(accum):
                start = step * batch + j * batch // accum
                old = list(range(start, start + batch // accum))
                part = old[rank * len(old) // world : (rank + 1) * len(old) // world]
                assert shard[step * accum + j] == part


@pytest.mark.parametrize(
    "hook", ["_load_from_checkpoint", "_load_rng_state", "_save_checkpoint", "add_model_card_callback", "evaluate"]
)
def test_the_hooks_the_stage_overrides_exist_as_it_expects(hook):
    ours, theirs = getattr(DistillSTTrainer, hook), getattr(SentenceTransformerTrainer, hook)
    assert ours is not theirs
    assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)


def test_one_process_trains_on_one_gpu_however_many_the_host_has(tmp_path, monkeypatch):
    """On a host with several GPUs a single process would be wrapped in DataParallel over all of them (and its
    batch multiplied by their number): the stage's arguments keep it on one."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # the GPUs transformers counts on such a host
    plain = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "plain"), per_device_train_batch_size=8)
    ours = DistillSTArguments(output_dir=str(tmp_path / "ours"), per_device_train_batch_size=8)
    assert (plain.n_gpu, plain.train_batch_size) == (4, 32)  # what the stage must not get
    assert (ours.n_gpu, ours.train_batch_size) == (1, 8)


def test_an_evaluation_encodes_as_sentence_transformers_does_and_tokenises_a_list_once(tiny, monkeypatch):
    """The evaluator's embeddings are ``model.encode``'s; the second evaluation of the same sentences reuses
    their tokenised batches."""
    from sentence_transformers import SentenceTransformer

    from tasks.ml import encoder
    from tasks.stages.distill import evaluation

    model = SentenceTransformer(tiny, device="cpu")
    texts = [" ".join(["an evaluated sentence", str(i)] * (1 + i % 4)) for i in range(300)]  # several batches
    tokenised, tokenise = [], encoder._length_batches
    monkeypatch.setattr(encoder, "_length_batches", lambda *args: tokenised.append(args) or tokenise(*args))
    first = evaluation.encode(model, texts)
    np.testing.assert_allclose(first, model.encode(texts), atol=1e-5)
    np.testing.assert_array_equal(evaluation.encode(model, texts), first)
    assert len(tokenised) == 1
