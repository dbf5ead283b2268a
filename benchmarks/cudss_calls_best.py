"""The fastest ``CudssSolver(config=...)`` per system of a ``cudss_calls.py --factorizations`` log.

    python -m benchmarks.cudss_calls_best factorizations.jsonl

Prints one line per system: ``<system> <variant> <config as JSON>`` (the variant with the least GPU time among those
that ran and reached a relative residual below 1e-8; ``{}`` when the default is fastest), then each variant's GPU ms
and residual.
"""

from __future__ import annotations

import json
import sys

from benchmarks.cudss_calls import FACTORIZATION_VARIANTS


def main(argv=None) -> int:
    path = (argv or sys.argv[1:])[0]
    records = [json.loads(line) for line in open(path) if line.startswith("{")]
    for r in records:
        ok = {k: v for k, v in r["variants"].items() if "error" not in v and v["relative_residual"] < 1e-8}
        if not ok:
            print(r["system"], "none {}")
            continue
        best = min(ok, key=lambda k: ok[k]["gpu_ms"])
        print(r["system"], best, json.dumps(FACTORIZATION_VARIANTS[best]))
    for r in records:
        cells = {k: (f"{v['gpu_ms']:.3f} ms, {v['relative_residual']:.1e}" if "error" not in v else v["error"][:70])
                 for k, v in r["variants"].items()}
        print("#", r["system"], r["unknowns"], r["matrix_type"], json.dumps(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
