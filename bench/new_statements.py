"""A new statement text's cost in the proxy's analysis, per statement kind, in CPU time (issue 16 goal 2).

    .venv/bin/python bench/new_statements.py [--n 1000] [--baseline REF]

Per kind, each call analyzes a text the analyzer has not seen (a fresh constant each call), in a session on a
catalog with one keyed CoW table ``orders``:

- ``alone``: with the shape templates off, so every text is parsed, rewritten and deparsed on its own (what
  the first text of a shape costs; most rewritten shapes of Django's full list come once);
- ``shape known``: with templates (the proxy's default), so after the first text of a kind the others are
  filled into the shape's template or decided by the shape;
- ``deparse``: ``proxy.sql.deparse.deparse`` of the rewritten statement's tree (pglast's printer on a checkout
  before branch i16deparse, libpg_query's deparser in C after);
- ``parse``: pglast's ``parse_sql`` of the client's text (Python nodes, what the analyzer parses into), next
  to ``parse_sql_protobuf`` and ``parse_sql_json`` (the C parse alone, and with its JSON).

``--corpus``: instead, the texts Django's full list sent (tests/proxy_sql/protobuf_corpus.json.gz, "django"),
each analyzed once on this catalog (none of Django's tables is a CoW table here: parsed, not rewritten),
with the parse calls alone on the same texts: CPU per text, total and median, and what part of the
analysis the parse is.

Each row is the best of 5 rounds of n/5 calls, CPU time of this process (``time.process_time``: other
processes' load does not count in, their cache and frequency effects do). ``--baseline REF``: the same rows
measured on a temporary checkout of git ref REF and on this checkout, in turns, 3 times each; each row the
best of the 3, with the ratio this / baseline.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

# Files in bench/ are named like the packages they measure: keep this folder off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import pglast  # noqa: E402
from pglast import parser  # noqa: E402

from proxy.sql import Analyzer, Catalog  # noqa: E402
from proxy.sql.deparse import deparse  # noqa: E402

KINDS = {
    "rewritten count": (
        'SELECT COUNT(*) AS "__count" FROM "orders" '
        'WHERE ("orders"."name" = \'n{i}\' AND "orders"."total" > 3)'
    ),
    "INSERT ON CONFLICT DO NOTHING": (
        'INSERT INTO "orders" ("id", "name") VALUES ({i}, \'a\'), ({j}, \'b\') ON CONFLICT DO NOTHING'
    ),
    "GROUP BY expansion": (
        'SELECT "orders"."id", "orders"."name", COUNT(*) AS "n" FROM "orders" WHERE "orders"."total" > {i} '
        'GROUP BY "orders"."id"'
    ),
    "TRUNCATE": 'TRUNCATE "orders" /* {i} */ RESTART IDENTITY',
    "schema-qualified": 'SELECT "id", "name" FROM "public"."orders" WHERE "total" > {i} ORDER BY "id"',
    "plain (parsed, not rewritten)": 'UPDATE "orders" SET "total" = "total" + 1 WHERE "name" = \'n{i}\'',
}


def _catalog() -> Catalog:
    """bench/sql_analyze.py's one CoW table ``orders``, keyed as an installed table (what the count rewrite
    needs); loaded by path, since this folder stays off the import path."""
    spec = importlib.util.spec_from_file_location("_bench_sql_analyze", os.path.join(_HERE, "sql_analyze.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    catalog: Catalog = module._catalog(keyed=True)
    return catalog


def per_call(fn: Callable[[int], object], n: int, repeat: int = 5) -> float:
    """CPU µs per call: the best of ``repeat`` rounds of ``n // repeat`` calls; ``fn`` gets a call number
    unique across rounds (for texts the cache has not seen)."""
    rounds = max(1, n // repeat)
    best = float("inf")
    for r in range(repeat):
        start = time.process_time()
        for i in range(r * rounds, (r + 1) * rounds):
            fn(i)
        best = min(best, (time.process_time() - start) / rounds)
    return best * 1e6


def _text(template: str, i: int) -> str:
    return template.format(i=i + 1, j=i + 1_000_001)


def measure(n: int) -> list[tuple[str, float]]:
    catalog = _catalog()
    rows: list[tuple[str, float]] = []
    for kind, template in KINDS.items():
        alone, known = Analyzer(cache_size=4 * n, templates=False), Analyzer(cache_size=4 * n)

        def analyze(i: int, a: Analyzer, t: str = template) -> object:
            return a.analyze(_text(t, i), catalog, True)

        rows.append((f"{kind}: analysis alone", per_call(lambda i, a=alone: analyze(i, a), n)))
        rows.append((f"{kind}: analysis, shape known", per_call(lambda i, a=known: analyze(i, a), n)))
        rewritten = Analyzer(templates=False).analyze(_text(template, 0), catalog, True).rewritten
        if rewritten is not None:
            tree = pglast.parse_sql(rewritten)[0]
            rows.append((f"{kind}: deparse of the rewrite", per_call(lambda i, r=tree: deparse(r), n)))
        rows.append(
            (f"{kind}: pglast.parse_sql", per_call(lambda i, t=template: pglast.parse_sql(_text(t, i)), n))
        )
        rows.append(
            (
                f"{kind}: parse_sql_protobuf",
                per_call(lambda i, t=template: parser.parse_sql_protobuf(_text(t, i)), n),
            )
        )
        rows.append(
            (f"{kind}: parse_sql_json", per_call(lambda i, t=template: parser.parse_sql_json(_text(t, i)), n))
        )
    return rows


def corpus() -> None:
    """The parse's part of a non-rewritten text's analysis, on Django's texts."""
    path = os.path.join(os.path.dirname(_HERE), "tests", "proxy_sql", "protobuf_corpus.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        texts = json.load(f)["django"]
    catalog = _catalog()
    analyzer = Analyzer(cache_size=2 * len(texts), templates=False)
    calls: dict[str, Callable[[str], object]] = {
        "analysis (Analyzer.analyze, new text)": lambda t: analyzer.analyze(t, catalog, True),
        "parse_sql_json (C parse + JSON)": parser.parse_sql_json,
        "parse_sql_json + json.loads": lambda t: json.loads(parser.parse_sql_json(t)),
        "pglast.parse_sql (Python nodes)": pglast.parse_sql,
        "parse_sql_protobuf (C parse + protobuf)": parser.parse_sql_protobuf,
    }
    print(f"{len(texts)} texts; CPU per text, µs")
    print(f"{'call':<42}  {'total ms':>9}  {'median':>7}  {'mean':>7}")
    for label, call in calls.items():
        each = []
        for text in texts:
            start = time.process_time()
            call(text)
            each.append((time.process_time() - start) * 1e6)
        each.sort()
        total = sum(each)
        print(f"{label:<42}  {total / 1000:9.1f}  {each[len(each) // 2]:7.1f}  {total / len(each):7.1f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def measure_checkout(path: str, n: int) -> list[tuple[str, float]]:
    """This script's rows in an interpreter whose ``proxy`` is the checkout at ``path``."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--n", str(n), "--json"],
        cwd=path,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = json.loads(out)
    if os.path.dirname(os.path.dirname(os.path.abspath(found["proxy"]))) != os.path.abspath(path):
        raise SystemExit(f"bench/new_statements.py: measured {found['proxy']}, not the checkout {path}")
    return [(label, value) for label, value in found["rows"]]


def side_by_side(ref: str, n: int) -> None:
    sys.path.insert(0, _HERE)  # (for _common only)
    import _common as common

    runs: dict[str, list[list[tuple[str, float]]]] = {"baseline": [], "this": []}
    with common.checkout(ref) as path:
        for _ in range(3):
            runs["baseline"].append(measure_checkout(path, n))
            runs["this"].append(measure_checkout(common.ROOT, n))
    best = {k: {label: min(r[i][1] for r in v) for i, (label, _) in enumerate(v[0])} for k, v in runs.items()}
    width = max(len(label) for label in best["this"])
    print(f"{'row':<{width}}  {ref[:12]:>12}  {'this':>8}  this/base   CPU µs/call (n={n}, best of 3 x 5)")
    for label, value in best["this"].items():
        base = best["baseline"].get(label)
        cells = f"{base:12.1f}  {value:8.1f}  {value / base:9.2f}" if base else f"{'–':>12}  {value:8.1f}"
        print(f"{label:<{width}}  {cells}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    args.add_argument("--n", type=int, default=1000)
    args.add_argument("--baseline", default=None, help="git ref to measure side by side with this checkout")
    args.add_argument("--corpus", action="store_true", help="the parse's part, on Django's texts")
    args.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (for --baseline)
    a = args.parse_args()
    if a.corpus:
        corpus()
        return
    if a.n < 5:
        args.error("--n must be at least 5")
    if a.baseline:
        side_by_side(a.baseline, a.n)
        return
    rows = measure(a.n)
    if a.json:
        import proxy

        print(json.dumps({"proxy": proxy.__file__, "rows": rows}))
        return
    width = max(len(r[0]) for r in rows)
    print(f"{'row':<{width}}  CPU µs/call (n={a.n}, best of 5 rounds)")
    for label, value in rows:
        print(f"{label:<{width}}  {value:8.1f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
