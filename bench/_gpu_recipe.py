"""The record of a ``bench/gpu_distill.sh`` run, read from its store's manifests: the wall seconds of each
phase, the teacher-encoding and training throughputs, and the validation's STS table (the student against its
same-size baseline, the headline). Run by the script: ``python -m bench._gpu_recipe --result NAME ...``."""

from __future__ import annotations

import argparse
import json
import os

from bench import results
from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tasks.stages.validate.promotion import BASELINE

MODEL_RUN = "gpu-recipe"


def record(store: str, seconds: dict[str, int], gpus: int) -> dict:
    """The run's figures: throughputs, phases, the distill run's stats and the STS table."""
    distilled = manifest.read(store, Stage.DISTILL, MODEL_RUN)
    validated = manifest.read(store, Stage.VALIDATE, MODEL_RUN)
    if distilled is None or validated is None:
        raise SystemExit(f"{store}: the run {MODEL_RUN!r} was not distilled and validated")
    encoded = [
        manifest.read(store, Stage.ENCODE_TEACHER, key) for key in manifest.list_keys(store, Stage.ENCODE_TEACHER)
    ]
    encoded_rows = sum(o.rows or 0 for m in encoded if m for o in m.outputs)
    stats, train_s = distilled.stats, distilled.document["timings_s"]["train"]
    return {
        "gpus": gpus,
        "phases_s": seconds,
        "teacher_sentences_per_s": round(encoded_rows / max(seconds.get("encode", 0), 1), 1),
        "train_sentences_per_s": round(stats["steps"] * distilled.params["batch_size"] / train_s, 1),
        "distill_params": distilled.params,
        "distill_stats": stats,
        "sts": validated.stats["sts"],
        "gate": validated.stats["gate"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result", required=True, help="bench/results/<result>.json; - prints the record only")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--seconds", default="", help="phase=seconds pairs, space-separated")
    args = parser.parse_args()
    seconds = {k: int(v) for k, v in (pair.split("=") for pair in args.seconds.split())}
    details = record(storage.to_uri(os.environ["HPD_STORE"]), seconds, args.gpus)
    if args.result == "-":
        print(json.dumps(details, indent=2, default=str))
        return
    table = details["sts"]
    result = results.write(
        args.result,
        unit="STS-B test Spearman x100",
        ours=table["student"]["STS-B test"],
        baseline_name=f"same-size {BASELINE}",
        baseline=table[BASELINE]["STS-B test"],
        higher_is_better=True,
        details=details,
    )
    print(f"student {result['ours']:.2f} against {result['baseline']['value']:.2f}; {details['phases_s']}")


if __name__ == "__main__":
    main()
