"""``python -m bench [NAME ...]``: run the benchmarks (all by default), then rewrite the docs' benchmark page."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from bench import results

NOT_BENCHMARKS = {"results", "st_trainer_baseline"}  # shared pieces, not benchmarks


def main(names: list[str]) -> None:
    modules = pkgutil.iter_modules([str(Path(__file__).parent)])
    available = sorted(m.name for m in modules if not m.name.startswith("_") and m.name not in NOT_BENCHMARKS)
    unknown = set(names) - set(available)
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {sorted(unknown)}; available: {available}")
    for name in names or available:
        print(f"== bench/{name}", flush=True)
        result = importlib.import_module(f"bench.{name}").main()
        print(
            f"   ours {result['ours']:.4g} {result['unit']}, {result['baseline']['name']} "
            f"{result['baseline']['value']:.4g}: ratio {result['ratio']}",
            flush=True,
        )
    results.write_page()


if __name__ == "__main__":
    main(sys.argv[1:])
