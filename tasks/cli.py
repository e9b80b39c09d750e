"""``hpd <stage> ...``: run any stage outside Airflow.

Options are generated from each stage's parameter model, so the CLI, the DAGs and the tests
validate the same way. Prints the run's summary as JSON; exits 2 on bad parameters and 1 on
bad input or storage errors, with a message naming the input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pydantic import BaseModel

from tasks import config, storage
from tasks.demo import DemoPlan


@dataclass(frozen=True)
class Command:
    module: str
    params: str
    help: str


COMMANDS: dict[str, Command] = {
    "stage-corpus": Command("tasks.stage_corpus", "StageCorpusParams",
                            "stage raw sentence files into a sentences partition"),
    "augment": Command("tasks.augment", "AugmentParams",
                       "augment a sentences partition (WordNet synonyms, back-translation, token operations)"),
    "encode-teacher": Command("tasks.encode_teacher", "EncodeTeacherParams",
                              "encode a sentences partition with the teacher, shard by shard"),
    "fit-pca": Command("tasks.fit_pca", "FitPCAParams",
                       "fit the PCA projection over teacher embeddings and write the projected targets"),
    "quality": Command("tasks.quality", "QualityParams",
                       "great-expectations checks of a partition's sentences, embeddings and targets"),
    "validate": Command("tasks.validate", "ValidateParams",
                        "score a distilled student (STS, fidelity, retrieval), apply the quality gate, promote"),
    "build-index": Command("tasks.build_index", "BuildIndexParams",
                           "encode the corpus with a distilled student, build a FAISS index and promote it"),
    "distill": Command("tasks.distill", "DistillParams",
                       "train the student on the projected targets (torchrun for several processes) and export it"),
}


def _is_list(annotation: object) -> bool:
    """``list[...]`` or ``list[...] | None``."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return any(typing.get_origin(option) is list for option in options)


def _add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=field.description)
        else:
            parser.add_argument(flag, dest=name, required=field.is_required(), default=argparse.SUPPRESS,
                                nargs="+" if _is_list(field.annotation) else None, metavar=name.upper(),
                                help=field.description)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        stage_parser = sub.add_parser(name, help=command.help, description=command.help)
        model = getattr(importlib.import_module(command.module), command.params)
        _add_model_options(stage_parser, model)
        stage_parser.add_argument("--force", action="store_true",
                                  help="rerun even if a matching manifest exists")
        stage_parser.add_argument("--quiet", action="store_true", help="no progress bars")
    search = sub.add_parser("search", help="nearest corpus sentences from the current index",
                            description="nearest corpus sentences from the current index")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5, help="how many results")
    search.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")
    demo = sub.add_parser("demo", help="run the DAG chain with `airflow dags test` on a corpus sample",
                          description="run hpd_ingest, hpd_retrain, hpd_index and hpd_quality_report with "
                                      "`airflow dags test` (SQLite metadata), then print where the outputs are")
    demo.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")
    demo.add_argument("--airflow-home", default="var/airflow", help="AIRFLOW_HOME of the demo's Airflow")
    demo.add_argument("--rows", type=int, default=DemoPlan.rows, help="corpus sentences to ingest")
    demo.add_argument("--date", type=date.fromisoformat, default=DemoPlan.day, help="the partition's day")
    demo.add_argument("--query", default="A man is playing a guitar.", help="a sample search on the new index")
    return parser


def _store(args: dict) -> str:
    """The ``--store`` option as a URI, else ``$HPD_STORE`` / ``./var/store``."""
    return storage.to_uri(args["store"]) if args["store"] else config.default_store()


def _demo(args: dict) -> int:
    from tasks import build_index, demo

    store = _store(args)
    plan = DemoPlan(store=store, airflow_home=Path(args["airflow_home"]).resolve(), day=args["date"],
                         rows=args["rows"])
    start = time.perf_counter()
    try:
        demo.run_chain(plan)
        where = demo.locations(store)
    except (demo.DemoError, ValueError, storage.StorageError) as exc:
        print(f"hpd: error: {exc}", file=sys.stderr)
        return 1
    print(f"\nThe DAG chain finished in {time.perf_counter() - start:.0f} s.")
    for name, uri in where.items():
        print(f"{name + ':':<40}{uri}")
    print(f"\nhpd search {args['query']!r}:")
    for hit in build_index.search(store, args["query"], 3):
        print(f"{hit['rank']:>3}  {hit['score']:.4f}  {hit['text']}")
    return 0


def _search(args: dict) -> int:
    from tasks import build_index

    store = _store(args)
    try:
        hits = build_index.search(store, args["query"], args["k"])
    except (ValueError, storage.StorageError) as exc:
        print(f"hpd: error: {exc}", file=sys.stderr)
        return 1
    for hit in hits:
        print(f"{hit['rank']:>3}  {hit['score']:.4f}  {hit['text']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    if args["command"] == "search":
        return _search(args)
    if args["command"] == "demo":
        return _demo(args)
    command = COMMANDS[args.pop("command")]
    force, quiet = args.pop("force"), args.pop("quiet")
    module = importlib.import_module(command.module)
    try:
        params = config.parse(getattr(module, command.params), args)
    except config.ConfigError as exc:
        print(f"hpd: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = module.run(params, force=force, progress=not quiet)
    except (ValueError, storage.StorageError) as exc:
        print(f"hpd: error: {exc}", file=sys.stderr)
        return 1
    summary = {"manifest": result.manifest_uri, "skipped": result.skipped,
               "stats": result.manifest.get("stats", {}), "outputs": len(result.manifest.get("outputs", []))}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
