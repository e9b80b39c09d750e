"""Every stage's parameters: frozen pydantic models, the one source the CLI, the DAG params and the
stages share. Light on purpose: this module imports neither torch nor transformers, so ``hpd --help``
and the DAG files can load it fast.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from tasks.core import catalog
from tasks.core.config import StageParams
from tasks.ml import teachers
from tasks.ml.choices import Activation, Init, Mode
from tasks.ml.models import DEFAULT_STUDENT, DEFAULT_TEACHER_SPEC

Format = Literal["auto", "text", "jsonl", "csv", "tsv", "parquet"]
Method = Literal["wordnet", "back_translation", "delete", "swap"]
IndexType = Literal["auto", "flat", "ivf_flat", "hnsw", "ivf_pq"]
# Every name-like parameter (a run, model run, PCA run or index name) is one store path segment, held to
# the catalog's one name rule; AutoRunName also takes "", which means "derive the name".
RunName = Annotated[str, Field(pattern=catalog.RUN_NAME_PATTERN)]
TEACHER_SAMPLE = 1000  # rows of a partition the teacher encodes by default (tasks.core.teacher_sample)
AutoRunName = Annotated[str, Field(pattern=catalog.AUTO_RUN_NAME_PATTERN)]


def _teacher_spec(spec: str) -> str:
    teachers.members(spec)  # a composite's members must be distinct and non-empty
    return spec


# A model spec, or several joined by "+" (a composite teacher, tasks.ml.teachers).
TeacherSpec = Annotated[str, AfterValidator(_teacher_spec)]


class StageCorpusParams(StageParams):
    source: str = Field(
        description="URI or path of a raw file, or of a folder/prefix of raw files; {ingest_date} (optionally"
        " with a strftime format: {ingest_date:%Y/%m/%d}) is replaced by the partition's date"
    )
    ingest_date: date = Field(description="the partition to write (from the Airflow data interval)")
    format: Format = Field("auto", description="input format; auto picks it from the file suffix")
    column: str = Field("text", min_length=1, description="text field (JSONL) or column (CSV/TSV/Parquet)")
    max_chars: int = Field(1000, gt=0, description="drop normalised sentences longer than this")
    shard_rows: int = Field(50_000, gt=0, description="rows per Parquet shard")
    batch_rows: int = Field(
        20_000, gt=0, description="records normalised at a time: with shard_rows, what bounds the memory held"
    )
    limit: int | None = Field(None, gt=0, description="read at most this many records (a sample)")
    max_input_bytes: int = Field(
        2 * 1024**3, gt=0, description="refuse a source file larger than this, as stored or once decompressed"
    )
    max_line_chars: int = Field(
        1_000_000, gt=0, description="refuse a source holding a longer line (or Parquet value) than this"
    )


class AugmentParams(StageParams):
    ingest_date: date = Field(description="the sentences partition to augment")
    methods: list[Method] = Field(["wordnet"], min_length=1, description="augmentation methods to apply")
    fraction: float = Field(1.0, gt=0, le=1, description="share of sentences each method augments")
    seed: int = Field(0, description="seed of which sentences each method varies and how")
    synonym_rate: float = Field(0.2, gt=0, le=1, description="wordnet: share of content words replaced")
    delete_rate: float = Field(0.1, gt=0, lt=1, description="delete: probability of dropping each word")
    swaps: int = Field(1, gt=0, description="swap: number of word swaps")
    teacher_sample: int = Field(
        TEACHER_SAMPLE,
        ge=0,
        description="vary only the sentences the teacher's sample of the partition can hold (the first N of its "
        "order: encode-teacher's teacher_sample); 0: every sentence",
    )
    sample_seed: int = Field(0, description="seed of the teacher sample's order (encode-teacher's sample_seed)")
    translate_forward: str | None = Field(None, description="back_translation: en->X model folder")
    translate_backward: str | None = Field(None, description="back_translation: X->en model folder")
    translate_batch_size: int = Field(16, gt=0, description="back_translation: sentences per translation batch")
    translate_beams: int = Field(1, gt=0, description="beam size (1: greedy, deterministic)")
    translate_max_tokens: int = Field(128, gt=0, description="back_translation: most tokens a translation may have")
    shard_rows: int = Field(50_000, gt=0, description="most rows a written Parquet shard holds")

    @model_validator(mode="after")
    def _translation_models(self) -> AugmentParams:
        if "back_translation" in self.methods and not (self.translate_forward and self.translate_backward):
            raise ValueError("back_translation needs translate_forward and translate_backward model folders")
        return self


class EncodeTeacherParams(StageParams):
    ingest_date: date = Field(description="the sentences partition to encode")
    teacher: TeacherSpec = Field(
        DEFAULT_TEACHER_SPEC, description="packaged model, local folder or cached hub id; 'a+b' for a composite"
    )
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="compute dtype (autocast); auto: bf16 where the hardware runs it natively, else fp32"
    )
    teacher_sample: int = Field(
        TEACHER_SAMPLE,
        ge=0,
        description="rows of the partition the teacher encodes: a deterministic sample (staged sentences by a seeded "
        "hash of their id, each followed by its augmented variants), what the PCA, retrains, drift and the quality "
        "checks read; the student indexes every row; 0: every row",
    )
    sample_seed: int = Field(0, description="seed of the sample's order")
    output_dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding type")
    batch_size: int = Field(
        16, gt=0, description="rows per forward pass (sorted by length): small batches pad less on a CPU; more on a GPU"
    )
    threads: int | None = Field(None, gt=0, description="torch intra-op threads (default: torch's)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to encode; auto: cuda when available")
    max_seq_length: int | None = Field(None, gt=0, description="default: the model's own")
    shards: list[int] | None = Field(None, description="encode only these input shard positions")


class FitPCAParams(StageParams):
    teacher: TeacherSpec = Field(DEFAULT_TEACHER_SPEC, description="the teacher whose embeddings to fit")
    partitions: list[date] | None = Field(None, description="ingest dates to fit on (default: all encoded)")
    k: int = Field(128, gt=0, description="output dimension")
    mode: Mode = Field("uncentered", description="uncentered: HPD's projection; centered: classic PCA")
    max_rows: int | None = Field(None, gt=0, description="sample about this many rows (HPD used 40k)")
    seed: int = Field(0, description="seed of the row sample")
    name: AutoRunName = Field("", description="run name (default: k<k>-<mode>)")
    write_targets: bool = Field(True, description="also write the projected targets dataset")
    basis_from: RunName | None = Field(
        None,
        description="keep the PCA basis the student of this distill run learned (its recorded artifact) instead of "
        "fitting one: the targets, and a student warm-started from that run, stay in its embedding space",
    )

    @model_validator(mode="after")
    def _default_name(self) -> FitPCAParams:
        if not self.name:
            object.__setattr__(self, "name", catalog.default_pca_name(self.k, self.mode))
        return self


class DistillParams(StageParams):
    teacher: TeacherSpec = Field(DEFAULT_TEACHER_SPEC, description="teacher whose projected targets to learn")
    pca_name: RunName = Field("k128-uncentered", description="the fit-pca run providing the targets")
    partitions: list[date] | None = Field(None, description="train on these ingest dates (default: all)")
    student: str = Field(DEFAULT_STUDENT, description="packaged model, local folder or cached hub id")
    student_layers: int | None = Field(None, gt=0, description="keep only the first N transformer layers")
    warm_start: RunName | None = Field(
        None,
        description="start from this distill run's exported student instead of the student model: its transformer, "
        "and its head when the targets are in the PCA basis it learned (else the head is initialised by init)",
    )
    activation: Activation = Field("tanh", description="the Dense head's activation (the paper's: tanh)")
    init: Init = Field("ridge", description="Dense head initialisation: ridge, pca or random")
    init_rows: int = Field(4096, gt=1, description="training rows sampled to fit the ridge/pca init")
    ridge_alpha: float = Field(1.0, gt=0, description="ridge init: the L2 penalty of the least-squares fit")
    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW, after the warm-up)")
    batch_size: int = Field(256, gt=0, description="global batch per optimizer step")
    grad_accum: int = Field(1, gt=0, description="micro-batches per optimizer step")
    epochs: int = Field(5, gt=0, description="passes over the training rows (max_steps stops sooner)")
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimizer steps")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="share of the steps the learning rate warms up over")
    weight_decay: float = Field(0.01, ge=0, description="AdamW's decoupled weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="clip the gradient's global L2 norm to this")
    max_seq_length: int = Field(128, gt=0, description="tokens a training sentence is cut to")
    dropout: float | None = Field(None, ge=0, lt=1, description="override the student's dropout")
    length_grouped: bool = Field(True, description="batches of sentences of similar length (less padding)")
    freeze_layers: int = Field(0, ge=0, description="train neither the embeddings nor the first N layers")
    cosine_weight: float = Field(0.0, ge=0, description="weight of a (1 - cosine) term added to the MSE")
    structure_weight: float = Field(
        0.0, ge=0, description="weight of an in-batch similarity term: MSE of the pairwise cosine matrices"
    )
    relation_weight: float = Field(
        1.0,
        ge=0,
        description="weight of an in-batch neighbourhood term: KL divergence from the teacher's (relation_on) to "
        "the student's softmax over each row's cosine similarities to the micro-batch's other rows (so with "
        "grad_accum or DDP it is not one process's whole-batch term; 0: the step's gradient is the same however "
        "the batch is split)",
    )
    relation_on: Literal["teacher", "targets"] = Field(
        "teacher",
        description="whose similarities the neighbourhood term follows: the teacher's own embeddings (full-"
        "dimensional, before the PCA: the targets' source) or the k-dimensional targets",
    )
    relation_temperature: float = Field(
        0.05, gt=0, description="temperature of the neighbourhood term's softmax (lower: sharper neighbourhoods)"
    )
    select_on: Literal["val_mse", "sts_dev"] = Field(
        "sts_dev",
        description="what picks the exported weights and stops early: validation MSE, or mean STS-B/SICK-R dev",
    )
    blend_initial: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        [0.25, 0.5, 0.75],
        description="after training, also score (1-a)*initial + a*final weights for each a (0 < a < 1) and "
        "export a blend that beats the best weights by select_on (the flag with no fractions: no blends)",
    )
    onnx: Literal["none", "fp32", "int8"] = Field(
        "none",
        description="also export the student as one ONNX graph for serving (onnx/ in the model folder); int8 "
        "quantises its weights and falls back to fp32 when it loses more than 0.3 STS dev points",
    )
    amp: Literal["auto", "off", "bf16", "fp16"] = Field("auto", description="auto: bf16 on CUDA, off on CPU")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train; auto: cuda when available")
    threads: int | None = Field(None, gt=0, description="torch intra-op threads (default: torch's)")
    val_fraction: float = Field(0.02, gt=0, lt=1, description="share of the rows held out to validate on")
    val_max_rows: int = Field(2000, gt=0, description="most validation rows")
    eval_every: int | None = Field(None, gt=0, description="validate every N steps (default: about 20 times a run)")
    patience: int | None = Field(None, gt=0, description="evaluations without improvement before stopping")
    checkpoint_every: int = Field(200, gt=0, description="steps between checkpoints (a rerun resumes from the last)")
    seed: int = Field(0, description="seed of the initialisation, the batches' order and dropout")
    name: AutoRunName = Field("", description="run name (default: <student>-<pca_name>)")

    @model_validator(mode="after")
    def _check(self) -> DistillParams:
        object.__setattr__(self, "blend_initial", sorted(set(self.blend_initial)))
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        if self.amp == "fp16" and self.device == "cpu":
            raise ValueError("fp16 AMP needs CUDA; use amp=bf16 on CPU")
        if not self.name:
            object.__setattr__(
                self, "name", catalog.default_student_run(self.student, self.student_layers, self.pca_name)
            )
        return self


class ValidateParams(StageParams):
    model_run: RunName = Field(description="the distill run to validate")
    pair_files: list[str] = Field([], description="extra STS pair files (CSV/TSV: sentence1, sentence2, score)")
    retrieval_sample: int = Field(2000, gt=10, description="corpus sentences for the recall@10 check")
    min_stsb: float | None = Field(None, description="minimum STS-B test score to promote")
    min_sickr: float | None = Field(None, description="minimum SICK-R test score to promote")
    max_regression: float = Field(1.0, ge=0, description="points a score may fall below the reference")
    max_dev_regression: float = Field(
        0.2,
        ge=0,
        description="points the student's mean STS dev score (STS-B dev, SICK-R trial) may fall below the promoted "
        "model's, both measured here: a retrain that does worse is not promoted",
    )
    teacher_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="the teacher's compute dtype; auto: bf16 where native, else fp32"
    )
    promote: bool = Field(True, description="move models/current.json when the gate passes")


class BuildIndexParams(StageParams):
    model_run: RunName | None = Field(
        None,
        description="the distill run whose student encodes the corpus (default: the promoted one, models/current.json)",
    )
    partitions: list[date] | None = Field(None, description="corpus partitions (default: every staged one)")
    index_type: IndexType = Field("auto", description="auto chooses by corpus size")
    sq8: bool = Field(False, description="store int8 scalar-quantised codes instead of float32")
    hnsw_m: int = Field(32, gt=1, description="HNSW: links per vector (M); more: better recall, a larger index")
    hnsw_ef_search: int = Field(16, gt=0, description="HNSW candidates kept in a search (efSearch): the first tried")
    nlist: int | None = Field(None, gt=0, description="IVF lists (default: 4 sqrt(n))")
    nprobe: int = Field(16, gt=0, description="IVF lists searched: the first tried")
    target_recall: float = Field(
        0.95,
        ge=0,
        le=1,
        description="double nprobe (IVF) or efSearch (HNSW) until recall@10 on the measure sample reaches this; "
        "0 keeps them as given",
    )
    pq_m: int = Field(16, gt=0, description="IVF-PQ sub-quantisers (must divide the dimension)")
    pq_bits: int = Field(8, ge=1, le=12, description="IVF-PQ bits per sub-quantiser code")
    refine: Literal["none", "sq8", "flat"] = Field(
        "flat",
        description="IVF-PQ: re-rank the candidates on the full vectors (flat) or int8 scalar-quantised codes "
        "(sq8), kept beside the PQ codes; none keeps PQ distances",
    )
    refine_k_factor: float = Field(16.0, ge=1, description="IVF-PQ re-rank: candidates re-scored, times k")
    min_recall: float = Field(
        0.9,
        ge=0,
        le=1,
        description="refuse (fail, publish and promote nothing) a build whose segment recalls less at 10 than this",
    )
    merge_fanout: int = Field(
        8, ge=2, description="merge the earliest segments of a tier once this many share it (segments.py)"
    )
    batch_size: int = Field(
        32, gt=0, description="rows per student forward pass, over all pending shards sorted by length"
    )
    dtype: Literal["fp32", "bf16"] = Field("fp32", description="the student's compute dtype as it encodes the corpus")
    name: AutoRunName = Field("", description="index name (default: the model run)")
    promote: bool = Field(True, description="move indexes/current.json to the new index")


class QualityParams(StageParams):
    ingest_date: date = Field(description="the partition to check")
    teacher: TeacherSpec | None = Field(DEFAULT_TEACHER_SPEC, description="also check this teacher's embeddings")
    teacher_dim: int | None = Field(None, gt=0, description="expected teacher dimension (default: as recorded)")
    max_chars: int = Field(1000, gt=0, description="longest sentence (characters) the check accepts")
    min_norm: float = Field(0.5, ge=0, description="smallest acceptable embedding L2 norm")
    max_norm: float = Field(1.5, gt=0, description="largest acceptable embedding L2 norm")
    pca_name: RunName | None = Field(None, description="also check the targets of this PCA run")
    min_variance: float = Field(1e-8, ge=0, description="smallest acceptable per-dimension target variance")


class DriftParams(StageParams):
    ingest_date: date = Field(description="the partition to score")
    model_run: RunName | None = Field(
        None,
        description="compare with the training data of this distill run (default: the promoted one)",
    )
    threshold: float = Field(0.25, gt=0, le=1, description="flag the partition when its drift score (0-1) reaches this")


class GCParams(StageParams):
    retention_hours: float = Field(
        24, ge=0, description="delete unreferenced objects only once they are older than this (hours)"
    )
    dry_run: bool = Field(False, description="list what would be deleted, delete nothing")
