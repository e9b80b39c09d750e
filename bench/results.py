"""The shared result format of every benchmark, and the docs' benchmark page generated from it.

``python -m bench.results`` rewrites ``docs/benchmarks.md`` from ``bench/results/*.json`` without running anything;
``python -m bench`` runs benchmarks and then rewrites it. Every figure on the page is read from a result file:
the prose of :data:`ABOUT` names figures by their path in the JSON (``{details/index/bytes_ratio}``).
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO

RESULTS = Path(__file__).parent / "results"
PAGE = REPO / "docs" / "benchmarks.md"
FIGURE = re.compile(r"\{([^{}]+)\}")


def machine() -> dict:
    model = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    return {"cores": len(os.sched_getaffinity(0)), "cpu_model": model, "python": platform.python_version()}


def write(
    name: str, *, unit: str, ours: float, baseline_name: str, baseline: float, higher_is_better: bool, details: dict
) -> dict:
    """Write ``bench/results/<name>.json``; ``ratio`` is ours/baseline (or baseline/ours when lower wins),
    so a ratio above 1 always means we are ahead."""
    ratio = ours / baseline if higher_is_better else baseline / ours
    result = {
        "benchmark": name,
        "unit": unit,
        "ours": ours,
        "baseline": {"name": baseline_name, "value": baseline},
        "ratio": round(ratio, 3),
        "higher_is_better": higher_is_better,
        "machine": machine(),
        "details": details,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


@dataclass(frozen=True)
class Table:
    """One row per entry of the dict (or list) at ``path``; one column per (header, sub-path) of an entry.

    A list's rows are named by each item's ``row`` sub-path; an empty sub-path is the entry itself."""

    path: str
    label: str
    columns: tuple[tuple[str, str], ...]
    row: str = ""


@dataclass(frozen=True)
class About:
    """What a benchmark compares, whether like-for-like (``yes: ...`` or ``no: ...``), and its notes and tables."""

    title: str
    compares: str
    like_for_like: str
    notes: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    minutes: int | None = None
    plot: str | None = None  # a figure the benchmark draws beside its result (bench/results/<plot>), shown on the page


_STS = (("STS-B test", "STS-B test"), ("SICK-R test", "SICK-R test"))
_SCORES = tuple((name, f"scores/{name}") for name in ("STS-B dev", "SICK-R dev", "STS-B test", "SICK-R test"))

ABOUT = {
    "bounded_retrain": About(
        "Bounded retrain: warm start against the base model",
        "A retrain on a bounded set (the new day, then older days drawn at random while they fit in "
        "`max_train_rows`) warm-started from the promoted student, against the same retrain from the base model; "
        "STS-B test, Spearman ×100.",
        "yes: the same data, steps, batch and seed",
        (
            "{details/steps/retrain} steps of 64 on at most {details/max_train_rows} rows, the stages' recipe. The "
            "warm start keeps the promoted student's PCA basis and so its head: its step 0 is the promoted student, "
            "and selection on the dev sets chose among its steps (the best: step {details/runs/warm/best_step}) and "
            "the blends of its start and end weights (the blend exported: {details/runs/warm/exported_blend}; – "
            "for none): {details/warm_minus_promoted/STS-B test} points from the promoted "
            "student on STS-B test and {details/warm_minus_promoted/SICK-R test} on SICK-R test (the mean STS dev "
            "score of each evaluated step is in `runs/warm/sts_dev_by_step`). A retrain that exports step 0 is the "
            "promoted student unchanged: `hpd_retrain` then skips its validation and promotes nothing. The run took "
            "{details/wall_seconds} s.",
        ),
        (Table("details/table", "model", _STS),),
    ),
    "distill_init": About(
        "Head initialisation",
        "The student's validation cosine to its targets before any training step, for each initialisation of the "
        "Dense head (`hpd distill --init`): `ridge` (the default), `pca` and `random` (HPD's).",
        "yes: the same student, data and targets; only the head's initialisation differs",
        ("Ridge is the default because it measured best by far, for both student depths.",),
        (Table("details/by_init", "student and head", (("validation cosine", "val_cosine"), ("val MSE", "val_mse"))),),
    ),
    "distill_quality": About(
        "Distillation quality on CPU",
        "The distilled 128-d students (HPD recipe, 6 and 3 layers) against the same architecture without "
        "distillation, its 384-d embeddings reduced to 128-d by a PCA (the same-size baseline), on STS-B and SICK-R "
        "(Spearman ×100 of cosine similarity). The dev sets choose, the test sets report.",
        "yes: the same architecture and output size; the baseline is the student's base model, undistilled",
        (
            "Data: {details/sentences} corpus sentences plus a quarter of WordNet variants, and the in-domain text "
            "(the distinct sentences of the STS-B and SICK training splits, without their scores); the teacher encodes "
            "every row. bf16 throughout, {details/threads} threads. The recipe: targets from two teachers "
            "(`all-mpnet-base-v2+all-MiniLM-L6-v2`, each L2-normalised, concatenated, PCA-128), both partitions, "
            "MSE plus the in-batch neighbourhood KL on the teacher's own (1,152-d, before the PCA) similarities "
            "(weight 1, temperature 0.05), length-grouped batches of 64, lr "
            "1e-4, warm-up 5 %, a ridge head, the weights of the best mean STS-B dev / SICK-R dev score or a blend "
            "of the initial and final weights (0.25, 0.5, 0.75) that scores better: "
            "{details/recipe_train_minutes} minutes of training for both students.",
            "Against its same-size baseline, the 6-layer student gains "
            "{details/gaps_vs_same_size/MiniLM-L6/STS-B test} points on STS-B test and "
            "{details/gaps_vs_same_size/MiniLM-L6/SICK-R test} on SICK-R test; the 3-layer one "
            "{details/gaps_vs_same_size/MiniLM-L3/STS-B test} and {details/gaps_vs_same_size/MiniLM-L3/SICK-R test}. "
            "The overlap@10 is the validation report's: the share of each of 2,000 corpus sentences' 10 nearest "
            "that the teacher (768-d) also ranks among its 10 nearest. One seed was run: the run-to-run spread is "
            "not measured.",
            "The levers below change one thing each from the reference, on the 6-layer student "
            "({details/lever_steps} steps of 64; the reference learns the corpus partition only). What helped, by the "
            "dev sets: the in-batch neighbourhood KL (the largest gain on one teacher's targets, a smaller one on two "
            "teachers'), targets from two teachers (the student starts much closer to them) and, on dev only, a lower "
            "learning rate. The in-domain text, the cosine term, frozen layers and length-grouped batches (more "
            "sentences per second) stay within noise at this length; max_seq_length 32 loses on SICK-R. Selecting on "
            "the STS dev sets, with or without blends, keeps the initial weights at this length, as the "
            "similarity-structure term does. The KL at weight 10 lowers fidelity: the weights of the lowest validation "
            "MSE stay the initial ones. Weighting the base student's block 0.5 gives targets nearer the teacher "
            "(overlap@10 {details/table/two teachers, the base student's at weight 0.5, + PCA-128/neighbour "
            "overlap@10} against {details/table/two teachers + PCA-128 (the recipe's targets)/neighbour overlap@10}) "
            "that score as well on STS, but the student starts farther from them (validation cosine "
            "{details/levers/targets from two teachers, the base student's at weight 0.5, with the in-batch "
            "neighbourhood KL/val_cosine/initial} against {details/levers/targets from two teachers, with the in-batch "
            "neighbourhood KL (weight 1, temperature 0.05)/val_cosine/initial}) and, at this length, scores lower on "
            "the dev sets. The KL on the teacher's own similarities, rather than the 128-d targets', is the lever "
            "that moves the 6-layer student: the PCA keeps only part of the teacher's neighbourhoods, and the "
            "student learns them from the teacher itself, while the MSE still teaches the targets (at "
            "{details/lever_steps} steps, validation cosine {details/levers/targets from two teachers, with the "
            "in-batch neighbourhood KL on the teacher's own (1,152-d) similarities/val_cosine/exported} against "
            "{details/levers/targets from two teachers, with the in-batch neighbourhood KL (weight 1, temperature "
            "0.05)/val_cosine/exported} with the KL on the targets'). With the KL on the "
            "targets' similarities, the recipe's 6-layer student had never risen more than half a point above its "
            "initial weights' mean dev score over 7,500 steps; on the teacher's, its best weights (step "
            "{details/recipe/MiniLM-L6/exported/step} of {details/recipe/MiniLM-L6/steps}, exported) score "
            "{details/recipe/MiniLM-L6/exported/sts_dev} against {details/recipe/MiniLM-L6/evals/0/sts_dev} at the "
            "start. The recipe's "
            "targets, loss, length-grouped batches, selection and blends are the defaults of `hpd distill` and "
            "`hpd_retrain`; its batch of 64, 5 % warm-up and step budget are this CPU benchmark's.",
        ),
        (
            Table(
                "details/table",
                "model",
                (
                    *((name, name) for name in ("STS-B test", "SICK-R test", "STS-B dev", "SICK-R dev")),
                    ("overlap@10 with the teacher", "neighbour overlap@10"),
                ),
            ),
            Table(
                "details/levers",
                "lever (6 layers)",
                (
                    ("sentences/s", "sentences_per_s"),
                    ("best step", "best_step"),
                    ("val cosine at start", "val_cosine/initial"),
                    ("exported", "val_cosine/exported"),
                    *_SCORES,
                    ("overlap@10", "scores/neighbour overlap@10"),
                ),
            ),
        ),
        140,
    ),
    "distill_train": About(
        "Training throughput: the stage against sentence-transformers' trainer",
        "The distill stage's training (its own batch order, loss, evaluation and checkpoint hooks, through "
        "`SentenceTransformerTrainer`) against the plain sentence-transformers trainer with `MSELoss`: MiniLM-L6 + "
        "Dense(128, tanh), the same batches in the same order, batch {details/batch}, max length "
        "{details/max_seq_length}, {details/threads} threads, fp32 on both sides, {details/rounds} rounds interleaved.",
        "yes for the headline: the same batches, dtype, threads and steps",
        (
            "The stage's hooks cost nothing measurable. Not like-for-like: the stage's default length-grouped order "
            "trains {details/length_grouped_fp32_vs_trainer_fp32/ours_per_s} sentences/s, "
            "{details/length_grouped_fp32_vs_trainer_fp32/ratio_of_medians}× the trainer's rows in order (the same "
            "dtype, batch, threads and steps, but other batches: sentence-transformers has no length-grouping "
            "sampler).",
        ),
    ),
    "index": About(
        "Index size and speed: the student against the teacher",
        "FAISS flat inner-product indexes over {details/rows} corpus sentences: the student's 128-d embeddings "
        "against the teacher's 768-d ones; queries/s at batch 64.",
        "no, on purpose: two models of different dimensions over the same rows and queries, the difference HPD buys",
        (
            "The student's index is {details/bytes_ratio}× smaller (D/k) and answers {details/qps_ratio_batch64}× "
            "more queries/s at batch 64 ({details/qps_ratio_batch1}× at batch 1); the paper reports "
            "{details/paper_1024_to_128/memory}× memory and {details/paper_1024_to_128/speed}× speed for 1024 → 128. "
            "The student's 10 nearest neighbours overlap the teacher's exact ones at "
            "{details/recall_at_10_student_vs_teacher_exact} (recall@10).",
        ),
        (
            Table(
                "details/by_index",
                "index",
                (
                    ("dim", "dim"),
                    ("bytes", "bytes"),
                    ("queries/s, batch 1", "queries_per_s_batch1"),
                    ("queries/s, batch 64", "queries_per_s_batch64"),
                ),
            ),
        ),
    ),
    "pca_fit": About(
        "Streaming PCA against scikit-learn",
        "The PCA stage's streaming fit (accumulating the mean and XᵀX over Parquet shards, then the "
        "eigendecomposition) against scikit-learn's `PCA(128).fit` on every row read into memory, over the same "
        "shards of {details/dim}-d embeddings; peak memory at {details/rows_of_headline} rows.",
        "yes: the same shards, rows and k, both reading the shards; both find the same explained variance",
        (
            "Synthetic correlated embeddings; each fit in a fresh process, shard reading included. The streaming "
            "fit's peak grows by {details/ours_peak_growth_mb_20k_to_200k} MB from 20k to 200k rows: its state is "
            "O(D²) whatever the row count.",
        ),
        (
            Table(
                "details/by_rows",
                "rows",
                (
                    ("ours, s", "ours/seconds"),
                    ("ours, peak MB", "ours/peak_mb"),
                    ("scikit-learn, s", "sklearn/seconds"),
                    ("scikit-learn, peak MB", "sklearn/peak_mb"),
                    ("explained variance, ours", "ours/explained_variance_ratio_sum"),
                    ("scikit-learn", "sklearn/explained_variance_ratio_sum"),
                ),
            ),
        ),
    ),
    "pipeline_overhead": About(
        "Orchestration overhead",
        "The wall time of the demo's four DAG runs through `airflow dags test`, in one process as `hpd demo` runs "
        "them ({details/sample_rows} sentences, {details/epochs} epoch), against the sum of the stages' own "
        "compute time (each manifest's `timings_s.total`); the ratio is compute / wall, so 1.0 would be no overhead.",
        "not two tools: the same runs, measured two ways",
        (
            "The other {details/overhead_seconds} s ({details/overhead_percent} %) are imports, DAG parsing and task "
            "bookkeeping. Rerunning the finished chain, where every stage skips, shows the fixed "
            "cost of the four `airflow dags test` runs.",
        ),
        (
            Table("details/dag_wall_seconds", "DAG", (("wall s, first run", ""),)),
            Table("details/rerun_all_skipped_wall_seconds", "DAG", (("wall s, rerun (all skipped)", ""),)),
            Table("details/stages", "stage", (("runs", "runs"), ("compute s", "seconds"))),
        ),
    ),
    "scale": About(
        "Scale: 100k, 1M and 5M sentences",
        "Staging, publishing teacher embeddings (synthetic 768-d ones through the real encode-teacher stage, the "
        "model swapped), the streaming PCA and the index (build-index's `auto` choice and search tuning) over "
        "distinct sentences derived from the vendored corpus, each stage in its own process; the headline is "
        "staging + PCA sentences/s at the largest size against the smallest (1: linear).",
        "no: every size ran in one run, but with tests and a demo running beside it (each stage's load average is in "
        "the JSON), so per-row times compare only roughly",
        (
            "Per row at the largest size against the smallest: staging {details/scaling/stage/seconds_per_row_ratio}×, "
            "PCA {details/scaling/pca/seconds_per_row_ratio}×, publishing "
            "{details/scaling/teacher_publish/seconds_per_row_ratio}×. Memory stays flat where the stage streams; the "
            "index holds its vectors.",
            "The index: `auto` chose {details/by_size/1000000/index/factory} at 1M and "
            "{details/by_size/5000000/index/factory} at 5M, its efSearch tuned on rows held out of it to "
            "{details/by_size/1000000/index/search_breadth/ef_search} and "
            "{details/by_size/5000000/index/search_breadth/ef_search}. On 1,000 fresh queries it recalled "
            "{details/by_size/1000000/index/recall_at_10} and {details/by_size/5000000/index/recall_at_10} at 10 (the "
            "target: 0.95), answering one query in {details/by_size/1000000/index/search_p50_ms_1thread} and "
            "{details/by_size/5000000/index/search_p50_ms_1thread} ms p50 on one thread; "
            "{details/by_size/1000000/index/size_mb} and {details/by_size/5000000/index/size_mb} MB, built and "
            "tuned in {details/by_size/1000000/index/build_s} and {details/by_size/5000000/index/build_s} s.",
            "Teacher encoding at these sizes belongs to the GPU workers: the packaged teacher in fp32 on this "
            "machine's cores took {details/teacher_encode/corpus/ms_per_sentence} ms a corpus sentence and "
            "{details/teacher_encode/derived/ms_per_sentence} ms a derived (longer) one, about "
            "{details/teacher_encode/projected/1000000/cpu_hours} CPU-hours for 1M sentences.",
        ),
        (
            Table(
                "details/by_size",
                "sentences",
                (
                    ("staging s", "stage/seconds"),
                    ("staging peak MB", "stage/peak_mb"),
                    ("publish s", "teacher_publish/seconds"),
                    ("publish peak MB", "teacher_publish/peak_mb"),
                    ("PCA s", "pca/seconds"),
                    ("PCA peak MB", "pca/peak_mb"),
                    ("index", "index/factory"),
                    ("build + tune s", "index/build_s"),
                    ("index MB", "index/size_mb"),
                    ("recall@10", "index/recall_at_10"),
                    ("search p50 ms", "index/search_p50_ms_1thread"),
                ),
            ),
        ),
        80,
    ),
    "serve": About(
        "Search service latency",
        "`hpd serve` with the demo's student over synthetic 100k (exact flat) and 1M (HNSW) indexes, one service per "
        "query encoder (the student's ONNX int8 graph; PyTorch fp32), warm, one client at a time through httpx and "
        "through the standard library's `http.client` (a lean client). The headline: p50 of one query at 1M against "
        "one search without a service (load the student and the index, then answer).",
        "no: the baseline loads the model and the index for its one search, which is what a service saves",
        (
            "The graph alone encodes the same queries one at a time in {details/encode_only_ms/p50} ms p50, before any "
            "HTTP or search; PyTorch answers {details/single_query_p50_torch_over_onnx}× slower at 1M. "
            "{details/concurrency} clients for {details/duration_s} s with a promotion halfway: the errors column "
            "counts failed requests, and the last column how long the new index took to answer after the pointer "
            "moved ({details/poll_s} s poll).",
        ),
        (
            Table(
                "details/sizes",
                "vectors",
                (
                    ("index", "index"),
                    ("ONNX int8 p50 ms", "onnx-int8/single_client_ms/p50"),
                    ("lean client", "onnx-int8/single_lean_client_ms/p50"),
                    ("PyTorch p50 ms", "torch/single_client_ms/p50"),
                    ("lean client", "torch/single_lean_client_ms/p50"),
                    ("ONNX int8, 4 clients, requests/s", "onnx-int8/requests_per_s"),
                    ("errors", "onnx-int8/errors"),
                    ("new index answers after, s", "onnx-int8/seconds_from_promotion_to_first_answer_of_new_index"),
                ),
                row="vectors",
            ),
        ),
        7,
    ),
    "stage_corpus": About(
        "Corpus staging against pandas",
        "`hpd stage-corpus` (polars in batches, ids hashed in a helper process) against pandas `read_csv` + "
        "normalise + `drop_duplicates` + `to_parquet` on the corpus ten times over, best of interleaved runs; peak "
        "memory each in a fresh process; de-duplication against partitions already staged.",
        "no: pandas normalises and de-duplicates too, but computes no ids, checks no contract, fingerprints no input "
        "and writes no manifest, shards or staged-id index",
        (
            "On the 88k corpus alone the ratio is {details/throughput/corpus/ratio}×, where fixed costs weigh. "
            "De-duplication costs follow the ids staged, not the partitions holding them (the table's last rows).",
        ),
        (
            Table(
                "details/peak_rss/ours",
                "source",
                (("rows", "rows"), ("peak MB, ours", "peak_mb")),
            ),
            Table("details/peak_rss/pandas", "source", (("rows", "rows"), ("peak MB, pandas", "peak_mb"))),
            Table(
                "details/dedup",
                "store before",
                (
                    ("prior partitions", "prior_partitions"),
                    ("staged ids", "prior_rows"),
                    ("seconds", "ours_seconds"),
                    ("previous staging, s", "previous_seconds"),
                ),
            ),
        ),
        7,
    ),
    "steady_state": About(
        "Day after day: the teacher's sample against the teacher encoding everything",
        "{details/volume/days} days of {details/volume/day_rows} new distinct sentences a day through the DAGs' "
        "stages with the packaged models (the composite teacher, the MiniLM-L6 student) and `hpd_retrain`'s plan and "
        "defaults: the previous path, where the teacher encodes (and augmentation varies) every staged row, against "
        "today's, where they take a bounded sample of each partition ({details/volume/teacher_sample} rows) "
        "and the student indexes every row; the headline is the median compute of a day without a retrain.",
        "yes: the same arrivals, models, retrain policy and training settings; only the teacher's sample differs",
        (
            "Arrivals: {details/volume/arrivals}. The teacher encoded at most "
            "{details/volume/teacher_rows_per_day_max/sampled} rows a day on the sampled path against "
            "{details/volume/teacher_rows_per_day_max/previous} on the previous one; a day without a retrain cost a "
            "median of {details/volume/quiet_day_median_compute_s/sampled} s against "
            "{details/volume/quiet_day_median_compute_s/previous} s "
            "({details/volume/quiet_day_ratio_previous_to_sampled}× less). End to end, as the DAGs' tasks run a day "
            "(each task a process that loads its models: `hpd stage-corpus`, `augment`, `encode-teacher`, "
            "`build-index`) on days {details/volume/end_to_end_freshness_s/days}, a day's sentences were searchable "
            "{details/volume/end_to_end_freshness_s/p95} s (p95) after staging began. The last promoted students "
            "scored {details/volume/last_promoted/sampled/scores/STS-B test} STS-B and "
            "{details/volume/last_promoted/sampled/scores/SICK-R test} SICK-R test on the sampled path, "
            "{details/volume/last_promoted/previous/scores/STS-B test} and "
            "{details/volume/last_promoted/previous/scores/SICK-R test} on the previous one "
            "({details/volume/training/max_steps} steps of {details/volume/training/batch_size} per retrain).",
            "After each warm-started promotion that kept its start's PCA basis (one embedding space), the old "
            "student's vectors searched with the new student's queries found at most a "
            "{details/volume/reuse_after_promotion/lowest_recall_at_10_vs_re_encode} share of what the new student's "
            "full re-encode finds at 10, against the {details/volume/reuse_after_promotion/threshold} that keeping old "
            "segments would need: the verdict, {details/volume/reuse_after_promotion/verdict}. These runs predate warm "
            "starts that keep their start's Dense head (their retrains fitted a new one by ridge); a retrain that "
            "keeps it changes less, so the share is to be measured again.",
            "Over a month, at {details/thirty_days/day_rows} sentences a day for {details/thirty_days/days} days, the "
            "retrain policy cost {details/thirty_days/totals_s/policy} s against "
            "{details/thirty_days/totals_s/per_partition} s for a retrain and a full index rebuild per partition "
            "({details/thirty_days/ratios_to_per_partition/policy}× less; it retrained "
            "{details/thirty_days/retrains/policy} times against {details/thirty_days/retrains/per_partition}; with "
            "retrain_fraction 0.5 {details/thirty_days/retrains/policy_retrain_fraction_0.5} times, "
            "{details/thirty_days/ratios_to_per_partition/policy_retrain_fraction_0.5}× less). A day without a "
            "retrain, run {details/thirty_days/daily_cost_without_retrain/repeated/repeats} times on copies of the "
            "store as it was on the morning of day 2 and of day 30 with the same new sentences, cost a median of "
            "{details/thirty_days/daily_cost_without_retrain/repeated/day_2_median_s} s and "
            "{details/thirty_days/daily_cost_without_retrain/repeated/day_30_median_s} s: "
            "{details/thirty_days/daily_cost_without_retrain/repeated/ratio_of_medians}×. The plot shows every "
            "day of the volume run.",
        ),
        minutes=100,
        plot="steady_state.svg",
    ),
    "student_throughput": About(
        "The students' encode throughput against the teacher",
        "Encode throughput of the distillation benchmark's recipe students (6 and 3 layers) and their exports "
        "against the teacher all-mpnet-base-v2, with their STS beside it: batch {details/batch} over the first "
        "{details/sentences} corpus sentences, tokenisation included, {details/threads} threads, {details/rounds} "
        "interleaved rounds (medians). The headline pairs the 6-layer student with the teacher, both in bf16.",
        "yes for the headline (both bf16, the same sentences, batch and threads); the other rows compare dtypes and "
        "exports",
        (
            "Which export pays depends on the CPU. Here the 6-layer student's ONNX int8 graph ran at "
            "{details/exports/MiniLM-L6/onnx int8/speed_ratio_vs_fp32}× PyTorch fp32's sentences/s and "
            "{details/exports/MiniLM-L6/onnx int8/speed_ratio_vs_fastest_float}× the bf16 student's; PyTorch's "
            "dynamic int8 moved STS-B test by {details/exports/MiniLM-L6/int8/delta_vs_fp32/STS-B test} points.",
        ),
        (
            Table(
                "details/table",
                "variant",
                (
                    ("sentences/s", "sentences_per_s"),
                    *_STS,
                    ("bytes per index vector", "index_bytes_per_vector"),
                ),
            ),
        ),
    ),
    "teacher_encode": About(
        "Teacher encoding against sentence-transformers",
        "The encode-teacher stage's encoder against sentence-transformers' `encode` on {details/sentences} corpus "
        "sentences, batch {details/batch}, {details/threads} threads on both sides, {details/rounds} rounds "
        "interleaved, bf16 autocast on both sides (both at a cosine of at least "
        "{details/min_cosine_to_st_fp32/ours_bf16} to the fp32 output).",
        "yes for the headline (bf16 against bf16)",
        (
            "fp32 against fp32: {details/fp32_vs_fp32/ratio_of_medians}×. Not like-for-like: the stage's bf16 "
            "against sentence-transformers' fp32 default is "
            "{details/not_like_for_like_ours_bf16_vs_st_fp32/ratio_of_medians}×.",
        ),
    ),
    "verify_overhead": About(
        "What verified reads cost",
        "Reading Parquet shards while checking each against the sha256 its manifest records, against the same reads "
        "unchecked (sentences and 768-d teacher-like shards); then whole stages, verified against unverified.",
        "yes: the same shards and reads, page cache warm",
        (
            "Raw reads, verified against unverified: sentences {details/read_ratio_by_kind/sentences}×, teacher "
            "embeddings {details/read_ratio_by_kind/teacher_embeddings}× (hashed on a second thread while Arrow "
            "parses). Within whole stages the reads' verification stays within the 5 % the store aims for.",
        ),
        (
            Table(
                "details/stages_summary",
                "stage",
                (
                    ("rows/s verified", "verified/rows_per_s"),
                    ("unverified", "unverified/rows_per_s"),
                    ("ratio", "ratio"),
                    ("paired median ratio", "ratio_paired_median"),
                    ("verification's share", "verification_share"),
                ),
            ),
        ),
    ),
}

INTRO = """\
Each benchmark compares a stage with what a user would otherwise use, in one run, and writes
`bench/results/<name>.json`. This page is generated from those files by `bench/results.py`
(`python -m bench.results` rewrites it; `python -m bench <name>` reruns a benchmark, then rewrites it), and a test
fails when a figure here differs from its file. A ratio above 1 means ours is ahead. The benchmarks ran on
different machines, each named with its figures: compare figures within one benchmark only."""

GPU = """\
`bench/gpu_distill.sh` runs the full recipe on CUDA through the pipeline's own stages (`--quick` for a check under
ten minutes, `--smoke` for the same plumbing on the CPU) and writes `bench/results/gpu_distill.json`. It has not run
on a GPU yet, so this page has no GPU figures."""


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _number(value)
    return str(value).replace("|", "\\|")


def _at(node: Any, path: str) -> Any:
    for part in filter(None, path.split("/")):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _fill(text: str, result: dict) -> str:
    """``text`` with each ``{path}`` replaced by the figure at that path of ``result``."""

    def figure(match: re.Match[str]) -> str:
        try:
            return _text(_at(result, match.group(1)))
        except (KeyError, IndexError, TypeError, ValueError):
            raise KeyError(f"{result['benchmark']}: no figure at {match.group(1)!r}") from None

    return FIGURE.sub(figure, text)


def _cell(entry: Any, path: str) -> str:
    try:
        return _text(_at(entry, path))
    except (KeyError, IndexError, TypeError):
        return "–"


def _table(result: dict, table: Table) -> str:
    data = _at(result, table.path)
    rows = data.items() if isinstance(data, dict) else [(_text(_at(item, table.row)), item) for item in data]
    lines = [
        "| " + " | ".join([table.label, *(header for header, _ in table.columns)]) + " |",
        "|---" * (len(table.columns) + 1) + "|",
    ]
    for name, entry in rows:
        label = _number(int(name)) if isinstance(name, str) and name.isdigit() else _text(name)
        lines.append("| " + " | ".join([label, *(_cell(entry, path) for _, path in table.columns)]) + " |")
    return "\n".join(lines)


def _machine(result: dict) -> str:
    m = result["machine"]
    return f"{m['cores']} cores, {m['cpu_model']}"


def _about(result: dict) -> About:
    name = result["benchmark"]
    return ABOUT.get(name) or About(name, result["baseline"]["name"], "not stated")


def _headline(result: dict) -> str:
    unit = result["unit"]
    return (
        f"ours {_number(result['ours'])} {unit}; {_fill(result['baseline']['name'], result)}: "
        f"{_number(result['baseline']['value'])} {unit}; ratio {result['ratio']:.2f}×"
    )


def _section(result: dict) -> str:
    about, name = _about(result), result["benchmark"]
    verdict, _, why = about.like_for_like.partition(": ")
    like = f"**Like-for-like:** {about.like_for_like}" if verdict.startswith("yes") else f"**Not like-for-like:** {why}"
    minutes = f" (about {about.minutes} minutes)" if about.minutes else ""
    m = result["machine"]
    parts = [
        f"## {about.title} {{#{name}}}",
        f"**What it compares.** {_fill(about.compares, result)}",
        f"**Headline.** {_headline(result)}.",
        _fill(like, result),
        f"**Machine:** {_machine(result)}, Python {m['python']}.",
        f"**Rerun:** `python -m bench {name}`{minutes}.",
        *(_fill(note, result) for note in about.notes),
        *(_table(result, table) for table in about.tables),
        *([f"![{about.title}](img/{about.plot})"] if about.plot else []),
    ]
    return "\n\n".join(parts)


def load(results: Path = RESULTS) -> list[dict]:
    """Every result file, by name."""
    return [json.loads(path.read_text()) for path in sorted(results.glob("*.json"))]


def summary(loaded: list[dict]) -> str:
    """One row per benchmark: its headline figures, whether like-for-like, and its machine."""
    rows = ["| benchmark | ours | baseline | ratio | like-for-like | machine |", "|---|---|---|---|---|---|"]
    for r in loaded:
        like = "yes" if _about(r).like_for_like.startswith("yes") else "**no**"
        rows.append(
            f"| [{_about(r).title}](#{r['benchmark']}) | {_number(r['ours'])} {r['unit']} | "
            f"{_number(r['baseline']['value'])} {r['unit']} | {r['ratio']:.2f}× | {like} | {_machine(r)} |"
        )
    return "\n".join(rows)


def page(results: Path = RESULTS) -> str:
    """The docs' benchmark page, from the result files under ``results``."""
    loaded = load(results)
    parts = [
        "<!-- Generated by bench/results.py from bench/results/*.json; do not edit by hand. -->",
        "# Benchmarks",
        INTRO,
        summary(loaded),
        *(_section(r) for r in loaded),
    ]
    if not (results / "gpu_distill.json").exists():
        parts.insert(4, GPU)
    return "\n\n".join(parts) + "\n"


def write_page() -> None:
    """Rewrite ``docs/benchmarks.md`` from the result files, with the plots they draw copied beside it."""
    PAGE.write_text(page())
    for about in ABOUT.values():
        if about.plot and (RESULTS / about.plot).exists():
            (PAGE.parent / "img").mkdir(exist_ok=True)
            (PAGE.parent / "img" / about.plot).write_bytes((RESULTS / about.plot).read_bytes())


if __name__ == "__main__":
    write_page()
