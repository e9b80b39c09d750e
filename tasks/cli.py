"""``hpd <stage> ...``: run any stage outside Airflow.

Options are generated from each stage's parameter model (:mod:`tasks.stages.params`), so the CLI,
the DAGs and the tests validate the same way; building the parser imports no stage, so ``--help``
is fast. Prints the run's summary as JSON on stdout and logs the run (``tasks.*`` at INFO) on stderr, with
a progress bar instead of the periodic progress lines when stderr is a terminal; other libraries log their
warnings only, the chattiest (FAISS's loader, transformers, torch) their errors only, unless ``--log-level``
says otherwise. Exits 2 on bad parameters and 1 on bad input or storage errors, with a message naming the input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
import types
import typing
from collections.abc import Sequence
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tasks.core import config, tables, uris
from tasks.core.catalog import RUN_NAME_PATTERN, Stage
from tasks.core.process_exit import end_without_final_collection
from tasks.core.settings import SettingsError
from tasks.core.uris import StorageError, store_root, to_uri
from tasks.ml.hits import Hit
from tasks.stages import registry

HELP = {
    Stage.STAGE_CORPUS: "stage raw sentence files into a sentences partition",
    Stage.AUGMENT: "augment a sentences partition (WordNet synonyms, back-translation, token operations)",
    Stage.ENCODE_TEACHER: "encode a sentences partition with the teacher, shard by shard",
    Stage.FIT_PCA: "fit the PCA projection over teacher embeddings and write the projected targets",
    Stage.QUALITY: "great-expectations checks of a partition's sentences, embeddings and targets",
    Stage.DRIFT: "drift of a partition's embeddings and text from the training data of the promoted model",
    Stage.VALIDATE: "score a distilled student (STS, fidelity, retrieval), apply the quality gate, promote",
    Stage.BUILD_INDEX: "encode the corpus with a distilled student, build a FAISS index and promote it",
    Stage.DISTILL: "train the student on the projected targets (torchrun for several processes) and export it",
    Stage.GC: "delete store objects no manifest, pointer or live checkpoint references, once past the retention",
}
DESCRIPTION = "run the pipeline's stages outside Airflow, search and serve the index, inspect the store"
MAX_HITS = 1000
# What a stage command's options hold beside its parameters: how to run it, not what it computes.
_RUN_OPTIONS = ("command", "force", "quiet", "output", "log_level")
OUTPUTS = ("json", "table")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Libraries that log routine chatter as INFO or WARNING (FAISS's loader lines, transformers' and torch's notices,
# Python warnings): at the default level, only their errors are shown.
CHATTY = ("faiss", "transformers", "sentence_transformers", "torch", "huggingface_hub", "py.warnings")
DEMO_OPTIONS = (  # each demo option: its name, its type, its default, what it is
    ("airflow_home", str, "var/airflow", "AIRFLOW_HOME of the demo's Airflow"),
    ("rows", int, 2000, "corpus sentences to ingest"),
    ("date", date.fromisoformat, date(2026, 11, 30), "the partition's day"),
    ("dags_folder", str, "dags", "the DAG files, from the checkout"),
    ("source", str, "data/corpus/sentences.tsv.gz", "the corpus to sample, from the checkout"),
    ("query", str, "A man is playing a guitar.", "a sample search on the new index"),
)


def command_name(stage: Stage) -> str:
    return stage.replace("_", "-")


def _options(annotation: object) -> tuple[object, ...]:
    return typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)


def _choices(annotation: object) -> list[Any] | None:
    """The allowed values of a ``Literal`` field (or a list of them), else None."""
    for option in _options(annotation):
        inner = typing.get_args(option)[0] if typing.get_origin(option) is list else option
        if typing.get_origin(inner) is typing.Literal:
            return list(typing.get_args(inner))
    return None


def _help(field: FieldInfo) -> str:
    text = (field.description or "").replace("%", "%%")  # argparse formats help with %
    if field.is_required() or "(default:" in text:
        return text
    default = "$HPD_STORE, else ./var/store" if field.default_factory else field.default
    return f"{text} (default: {default})".strip()


def _add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=_help(field)
            )
            continue
        many = any(typing.get_origin(option) is list for option in _options(field.annotation))
        emptiable = isinstance(field.default, list) and bool(field.default)  # a flag alone sets it to []
        choices = _choices(field.annotation)
        parser.add_argument(
            flag,
            dest=name,
            required=field.is_required(),
            default=argparse.SUPPRESS,
            nargs="*" if emptiable else "+" if many else None,
            choices=choices,
            metavar=None if choices else name.upper(),
            help=_help(field),
        )


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="log lines at this level and above, from the pipeline and every library (default: the pipeline's "
        "INFO lines, other libraries' warnings, FAISS's, transformers' and torch's errors only)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="hpd", description=DESCRIPTION, parents=[common])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to run")
    for stage, model in registry.STAGES.items():
        stage_parser = sub.add_parser(command_name(stage), help=HELP[stage], description=HELP[stage], parents=[common])
        _add_model_options(stage_parser, model)
        stage_parser.add_argument("--force", action="store_true", help="rerun even if a matching manifest exists")
        stage_parser.add_argument(
            "--quiet",
            action="store_true",
            help="no progress bars, even on a terminal (progress is logged at intervals)",
        )
        shown = "the verdict and both profiles side by side" if stage == Stage.DRIFT else "the summary, a row a field"
        _add_output(stage_parser, "json", "the run's summary (manifest, skipped, stats, outputs)", shown)
    search = sub.add_parser(
        "search",
        help="nearest corpus sentences from the current index",
        description="nearest corpus sentences from the current index",
        parents=[common],
    )
    search.add_argument("query", help="the text to search for")
    search.add_argument(
        "-k", type=_bounded(1, MAX_HITS), default=5, help=f"how many results, 1-{MAX_HITS} (default: 5)"
    )
    search.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")
    _add_output(search, "table", "each hit's rank, score, sentence id and text", "a line a hit: rank, score, text")
    search.add_argument(
        "--local",
        action="store_true",
        help="load the index here rather than asking a running `hpd serve` ($HPD_SERVE_URL, else "
        "http://127.0.0.1:8765; used only when it serves the same store)",
    )
    for add in (_add_serve_parser, _add_demo_parser, _add_lineage_parser, _add_runs_parser, _add_completion_parser):
        add(sub, common)
    return parser


def _version() -> str:
    try:
        return metadata.version("hpd-pipeline")
    except metadata.PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown (not installed)"


def _add_completion_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="print the completion hook of a shell for hpd (argcomplete's): hpd itself completes the "
        "line typed so far. Load it with `source <(hpd completion bash)` (zsh alike), or `hpd completion fish | "
        "source`, or save it where the shell reads completions",
        parents=[common],
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell the script is for")


def _add_serve_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    description = (
        "a long-lived HTTP search service: loads the promoted student and index once, answers GET /search?q=&k= "
        "and POST /search {queries, k}, reports GET /health, and swaps in a newly promoted index (checked by "
        "the etag of indexes/current.json every --poll-s seconds) without failing a request"
    )
    serve = sub.add_parser(
        "serve",
        help="serve searches over HTTP, hot-swapping promoted indexes",
        description=description,
        parents=[common],
    )
    serve.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=_bounded(1, 65535), default=8765, help="port (default: 8765)")
    serve.add_argument(
        "--poll-s", type=_positive_seconds, default=5.0, help="seconds between pointer checks (default: 5)"
    )
    serve.add_argument(
        "--query-encoder",
        choices=["auto", "torch"],
        default="auto",
        help="what encodes queries: auto, the student's ONNX graph where distill exported one (onnx), else "
        "PyTorch; torch, always PyTorch (default: auto)",
    )
    serve.add_argument(
        "--search-threads",
        type=_bounded(1, 256),
        default=1,
        help="OpenMP threads a FAISS search may use (default: 1: requests already run side by side)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every request with its query string, as uvicorn does (default: off: it holds users' query texts)",
    )


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{value} is not within (0, 3600] seconds")
    return value


def _add_lineage_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    description = (
        "where an artifact came from: walk back from a pointer, a model run, a manifest or any published "
        "object to the staged partitions and raw sources, verifying each object's sha256 on the way; "
        "with --impacted, every run and artifact made from a partition or source, and whether it is promoted"
    )
    lineage = sub.add_parser(
        "lineage", help="trace an artifact back to its sources, or forward", description=description, parents=[common]
    )
    lineage.add_argument(
        "target",
        nargs="?",
        default=None,
        help="indexes/current.json, models/current.json, a model run, a manifest or an object: URI, path or "
        "store-relative key (default: indexes/current.json)",
    )
    lineage.add_argument(
        "--impacted", metavar="PARTITION_OR_SOURCE", help="a partition (ingest_date=YYYY-MM-DD) or a source / object"
    )
    _add_output(lineage, "table", "the trace as a record", "the trace as a tree")
    lineage.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")


def _add_runs_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    runs = sub.add_parser(
        "runs",
        help="list model runs, or compare two",
        description="model runs (distill, with their validation) as their manifests record them",
        parents=[common],
    )
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION", help="list or compare")
    listing = actions.add_parser(
        "list",
        parents=[common],
        help="every model run, newest first",
        description="every model run, newest first: created, input partitions, the student's STS-B and SICK-R "
        "test scores, the gate decision (passed, failed, not validated, stale) and * on the promoted one",
    )
    comparing = actions.add_parser(
        "compare",
        parents=[common],
        help="two model runs side by side",
        description="two model runs side by side: params, input partitions, STS, fidelity and retrieval metrics, "
        "the gate and its margins, durations; * marks the rows that differ",
    )
    comparing.add_argument("a", type=_run_name, metavar="A", help="a model run (distill run name)")
    comparing.add_argument("b", type=_run_name, metavar="B", help="the model run to compare it with")
    for parser in (listing, comparing):
        _add_output(parser, "table", "the runs as records", "a row a run, or a row a field")
        parser.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")


def _add_output(parser: argparse.ArgumentParser, default: str, as_json: str, as_table: str) -> None:
    """The one output option of every command that prints a result: ``-o/--output json|table``."""
    help_text = f"json: {as_json}; table: {as_table} (default: {default})"
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default, help=help_text)


def _run_name(text: str) -> str:
    """An argparse type: a model run's name (one path segment, :data:`catalog.RUN_NAME_PATTERN`)."""
    if not re.fullmatch(RUN_NAME_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a run name (letters, digits and _ . = -)")
    return text


def _add_demo_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the DAG chain with `airflow dags test` on a corpus sample",
        description="run hpd_ingest, hpd_retrain, hpd_index and hpd_quality_report with "
        "`airflow dags test` (SQLite metadata), then print where the outputs are",
        parents=[common],
    )
    demo.add_argument("--store", default=None, help="root URI of the object store (default: $HPD_STORE)")
    for name, kind, default, text in DEMO_OPTIONS:
        flag = "--" + name.replace("_", "-")
        demo.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default})")
    _add_output(demo, "table", "the chain's seconds, its outputs and the search's hits", "the same as lines")


def _bounded(low: int, high: int) -> typing.Callable[[str], int]:
    """An argparse type: an integer within [low, high]."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not within {low}-{high}")
        return value

    return parse


def _store(args: argparse.Namespace) -> str:
    """The ``--store`` option as a URI, else ``$HPD_STORE`` / ``./var/store``."""
    try:
        return store_root(to_uri(args.store)) if args.store else config.default_store()
    except StorageError as exc:
        raise config.ConfigError(f"--store: {exc}") from None


def _demo(args: argparse.Namespace) -> int:
    from tasks import demo
    from tasks.ml import vector_index

    store = _store(args)
    plan = demo.DemoPlan(
        store=store,
        airflow_home=Path(args.airflow_home).resolve(),
        dags_folder=Path(args.dags_folder).resolve(),
        source=Path(args.source).resolve(),
        day=args.date,
        rows=args.rows,
    )
    start = time.perf_counter()
    try:
        plan.run_chain()
        where = demo.locations(store)
    except (demo.DemoError, ValueError, StorageError) as exc:
        _error(exc)
        return 1
    seconds, hits = time.perf_counter() - start, vector_index.search(store, args.query, 3)
    if args.output == "json":
        record = {"seconds": round(seconds, 1), "outputs": where, "query": args.query}
        print(json.dumps({**record, "hits": [hit.to_dict() for hit in hits]}, indent=2))
        return 0
    print(f"\nThe DAG chain finished in {seconds:.0f} s.")
    for name, uri in where.items():
        print(f"{name + ':':<40}{uri}")
    print(f"\nhpd search {args.query!r}:")
    for hit in hits:
        print(hit.line())
    return 0


def _search(args: argparse.Namespace) -> int:
    from tasks.serve import client, queries

    try:
        query = queries.checked(args.query)
    except queries.QueryError as exc:
        _error(exc)
        return 1
    store = _store(args)
    answered = None if args.local else client.search(store, query, args.k)
    try:
        hits = answered.hits if answered else _search_here(store, query, args.k)
    except (ValueError, StorageError) as exc:
        _error(exc)
        return 1
    if args.output == "json":
        print(json.dumps([hit.to_dict() for hit in hits], indent=2))
        return 0
    for hit in hits:
        print(hit.line())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tasks.serve import app

    app.serve(
        _store(args),
        host=args.host,
        port=args.port,
        poll_s=args.poll_s,
        query_encoder=args.query_encoder,
        search_threads=args.search_threads,
        access_log=args.access_log,
    )
    return 0


def _search_here(store: str, query: str, k: int) -> list[Hit]:
    from tasks.ml import vector_index  # imported only here: an answer from the service needs no torch

    return vector_index.search(store, query, k)


def _lineage(args: argparse.Namespace) -> int:
    from tasks.core import lineage

    store = _store(args)
    if args.target and args.impacted:
        raise config.ConfigError("give a TARGET or --impacted PARTITION_OR_SOURCE, not both")
    try:
        if args.impacted:
            runs = lineage.impacted(store, args.impacted)
            record: Any = {"impacted": args.impacted, "runs": [run.to_dict() for run in runs]}
            text = lineage.render_impacted(store, runs)
        else:
            traced = lineage.trace(store, args.target or lineage.Pointer.INDEX)
            record, text = traced.to_dict(), traced.render()
    except (ValueError, StorageError) as exc:
        _error(exc)
        return 1
    print(json.dumps(record, indent=2) if args.output == "json" else text)
    return 0


def _runs(args: argparse.Namespace) -> int:
    from tasks.core import runs

    store = _store(args)
    try:
        if args.action == "compare":
            comparison = runs.compare(store, args.a, args.b)
            record: Any = comparison.to_dict()
            text = comparison.render()
        else:
            found = runs.list_runs(store)
            record, text = [run.to_dict() for run in found], runs.render_list(found)
    except (ValueError, StorageError) as exc:
        _error(exc)
        return 1
    print(json.dumps(record, indent=2) if args.output == "json" else text)
    return 0


def _run_stage(stage: Stage, args: argparse.Namespace) -> int:
    values = {name: value for name, value in vars(args).items() if name not in _RUN_OPTIONS}
    try:
        params = config.parse(registry.STAGES[stage], values)
    except config.ConfigError as exc:
        _error(ValueError(_by_flag(exc)))
        return 2
    module = registry.module(stage)
    bars = not args.quiet and sys.stderr.isatty()
    try:
        with _bars_and_logs() if bars else contextlib.nullcontext():
            result = module.run(params, force=args.force, progress=bars)
    except (ValueError, StorageError) as exc:
        _error(exc)
        return 1
    summary = {
        "manifest": result.manifest_uri,
        "skipped": result.skipped,
        "stats": result.stats,
        "outputs": len(result.outputs),
    }
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    elif stage == Stage.DRIFT:
        print(module.render(result.manifest.key, result.stats))
    else:
        rows = {"manifest": result.manifest_uri, "skipped": result.skipped, **tables.flat("stats", result.stats)}
        print(
            tables.table(
                [[name, tables.shown(value)] for name, value in {**rows, "outputs": len(result.outputs)}.items()]
            )
        )
    return 0


def _by_flag(exc: config.ConfigError) -> str:
    """A parameter error as the command line gave it: each problem led by its flag (with a list item's position,
    from 1); a problem of the options together, alone."""
    shown = []
    for where, problem in exc.problems:
        if not where:
            shown.append(problem)
            continue
        name, *inner = where
        items = "".join(f" (item {int(part) + 1})" if part.isdigit() else f".{part}" for part in inner)
        shown.append(f"--{name.replace('_', '-')}{items}: {problem}")
    return "; ".join(shown) or str(exc)


def _error(exc: BaseException) -> None:
    """The one line a failure prints, credentials in any URI it quotes removed."""
    print(f"hpd: error: {uris.redact(str(exc))}", file=sys.stderr)


class _Redacting(logging.Filter):
    """Every log line with the credentials of any URI in it removed (a flag or a library may quote one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = uris.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def configure_logging(level: str | None = None) -> None:
    """Log lines on stderr: everything at ``level``; by default ``tasks.*`` at INFO, other libraries' warnings
    and the :data:`CHATTY` ones' errors. A no-op where logging is set up (Airflow, pytest)."""
    if logging.getLogger().handlers:
        return
    logging.captureWarnings(True)  # Python warnings (torch's, transformers') go through logging: py.warnings
    logging.basicConfig(level=level or logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Redacting())
    logging.getLogger("tasks").setLevel(level or logging.INFO)
    for name in CHATTY:
        logging.getLogger(name).setLevel(level or logging.ERROR)
    # transformers sets its own loggers' level from this variable when it is first imported
    if level:
        os.environ["TRANSFORMERS_VERBOSITY"] = level.lower()
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _bars_and_logs() -> contextlib.AbstractContextManager[None]:
    """Log lines printed above the progress bars rather than through them."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def _completion(args: argparse.Namespace) -> int:
    from tasks import completion

    print(completion.script(args.shell), end="")
    return 0


COMMANDS = {
    "search": _search,
    "serve": _serve,
    "demo": _demo,
    "lineage": _lineage,
    "runs": _runs,
    "completion": _completion,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: this process's arguments, when it ends with the command)."""
    if argv is None:
        end_without_final_collection()
    parser = build_parser()
    if argv is None and "_ARGCOMPLETE" in os.environ:  # a shell's completion request: answer it and exit
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", None))
    command = args.command
    try:
        if command in COMMANDS:
            return COMMANDS[command](args)
    except (config.ConfigError, SettingsError) as exc:
        _error(exc)
        return 2
    return _run_stage(Stage(command.replace("-", "_")), args)


if __name__ == "__main__":
    sys.exit(main())
