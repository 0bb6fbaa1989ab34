"""The SQL analysis' CPU on a recorded stream of a session's texts, replayed in one process per checkout
(issue 16 goal 3): what the proxy's main thread spends deciding new texts, without the relay, the sockets
and the wall-time noise of a shared machine.

    .venv/bin/python bench/analysis_replay.py record --trace FILE -- COMMAND ...
    .venv/bin/python bench/analysis_replay.py replay --trace FILE [--baseline CHECKOUT] [--rounds 5]

``record`` runs COMMAND (e.g. ``.venv/bin/python -m tests.peers.django_suite --modules queries``) with a
``sitecustomize`` on ``PYTHONPATH`` that makes every process importing ``proxy.analysis`` (the ``cowproxy
serve`` it starts) append each call of ``ProxyAnalyzer.analyze`` and ``ProxyAnalyzer.shape`` to FILE, with
the catalogs they were given (pickled once each).

``replay`` gives the calls, in order, to a fresh ``ProxyAnalyzer`` (with the C relay's shape key, as ``serve``
makes it) in a child process of each checkout's own interpreter (``CHECKOUT/.venv/bin/python``), the checkouts
in turn per round, and prints the medians of the thread CPU of the ``analyze`` calls (split into cache hits,
texts answered by a shape, by a shape's rewrite template, texts rewritten and the rest) and of the ``shape``
calls, with the ratio of this checkout to the baseline; then a new text's cost (a session's text the cache did
not answer): median and p99 µs, whole and by part (pglast's parses, the analysis' own work, the rewriter
with its deparse, the deparse alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Written as sitecustomize.py by ``record``: wraps ProxyAnalyzer once proxy.analysis is imported.
_RECORDER = r"""
import os, pickle, sys, threading

_PATH = os.environ["COW_ANALYSIS_TRACE"]
_lock = threading.Lock()
_seen = set()


def _write(record):
    with _lock, open(_PATH, "ab") as out:
        pickle.dump(record, out)


def _catalog(catalog):
    if catalog is None:
        return None
    if catalog.ident not in _seen:
        _seen.add(catalog.ident)
        _write(("c", catalog.ident, catalog))
    return catalog.ident


def _patch(module):
    cls = module.ProxyAnalyzer
    analyze, shape = cls.analyze, cls.shape

    def traced_analyze(self, sql, catalog, in_session, *, prepared=False):
        _write(("a", sql, _catalog(catalog), in_session, prepared))
        return analyze(self, sql, catalog, in_session, prepared=prepared)

    def traced_shape(self, sql, catalog, verdict):
        _write(("s", sql, _catalog(catalog)))
        return shape(self, sql, catalog, verdict)

    cls.analyze, cls.shape = traced_analyze, traced_shape


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "proxy.analysis":
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _Finder())
"""

# Run by each checkout's interpreter (its proxy package first on the path): replays the trace, prints JSON.
_CHILD = r"""
import json, pickle, sys, time
sys.path.insert(0, sys.argv[2])
from proxy.analysis import ProxyAnalyzer
try:
    from proxy.fastrelay import FastRelay, UNAVAILABLE
    key = FastRelay.shape_key if UNAVAILABLE is None else None
except ImportError:
    key = None

records, catalogs = [], {None: None}
with open(sys.argv[1], "rb") as trace:
    while True:
        try:
            record = pickle.load(trace)
        except EOFError:
            break
        if record[0] == "c":
            catalogs[record[1]] = record[2]
        else:
            records.append(record)

import pglast
import pglast.stream
import proxy.sql.analyze as analyze_module
import proxy.sql.rewrites as rewrites_module

parses = {"json": 0, "nodes": 0}
clock = time.thread_time
# The thread CPU of the call at hand spent in pglast's parses, the rewriter (its rules and deparse) and the
# deparse alone: a new text's cost per part.
parts = {"parse": 0.0, "rewrite": 0.0, "deparse": 0.0}


rewriting = [0]  # the rewriter's own parses (of its templates) are its cost, not the parse's


def timed(part, function, count=None):
    def call(*args, **kwargs):
        if count is not None:
            parses[count] += 1
        if part == "parse" and rewriting[0]:
            return function(*args, **kwargs)
        rewriting[0] += part == "rewrite"
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            parts[part] += clock() - start
            rewriting[0] -= part == "rewrite"

    return call


analyze_module.parse_sql_json = timed("parse", analyze_module.parse_sql_json, "json")
pglast.parse_sql = timed("parse", pglast.parse_sql, "nodes")
rewrites_module.Rewriter.rewrite = timed("rewrite", rewrites_module.Rewriter.rewrite)
pglast.stream.RawStream.__call__ = timed("deparse", pglast.stream.RawStream.__call__)
try:  # a checkout whose rewriter prints with proxy.sql.deparse (its own back-links) instead of RawStream()
    import proxy.sql.deparse
    import proxy.sql.rewrites.app_path as app_path_module

    for printing in (rewrites_module, app_path_module):
        printing.deparse = timed("deparse", printing.deparse)
except ImportError:
    pass
analysis = ProxyAnalyzer(shape_key=key)
inner = analysis._analyzer
costly = []
verdicts = {}
cpu = {"hit": 0.0, "shape": 0.0, "template": 0.0, "rewritten": 0.0, "other": 0.0, "shape calls": 0.0}
count = dict.fromkeys(cpu, 0)
new_texts = []  # per analysed text that the cache did not answer: (kind, total, parse, rewrite, deparse) in s
for record in records:
    if record[0] == "a":
        _, sql, ident, in_session, prepared = record
        hits, shapes = inner.hits, inner.shape_hits
        templates = getattr(inner, "template_hits", 0)  # (a checkout without rewrite templates: none)
        parts.update(parse=0.0, rewrite=0.0, deparse=0.0)
        start = clock()
        verdict = analysis.analyze(sql, catalogs[ident], in_session, prepared=prepared)
        spent = clock() - start
        verdicts[sql] = verdict
        if inner.hits > hits:
            kind = "hit"
        elif inner.shape_hits > shapes:
            kind = "shape"
        elif getattr(inner, "template_hits", 0) > templates:
            kind = "template"
        elif verdict.rewritten is not None:
            kind = "rewritten"
        else:
            kind = "other"
        if kind != "hit" and in_session:
            new_texts.append((kind, spent, parts["parse"], parts["rewrite"], parts["deparse"]))
    else:
        _, sql, ident = record
        verdict = verdicts.get(sql)
        if verdict is None:
            continue
        start = clock()
        analysis.shape(sql, catalogs[ident], verdict)
        spent = clock() - start
        kind = "shape calls"
    cpu[kind] += spent
    count[kind] += 1
    if len(sys.argv) > 3 and kind != "hit":
        costly.append((spent, kind, sql))
if costly:
    with open(sys.argv[3], "w") as out:
        for spent, kind, sql in sorted(costly, reverse=True):
            out.write(f"{spent * 1e6:.0f}\t{kind}\t{sql[:300]!r}\n")
print(json.dumps({"cpu": cpu, "count": count, "parses": parses, "new_texts": new_texts}))
"""


def record(trace: Path, command: list[str]) -> int:
    trace.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "sitecustomize.py").write_text(_RECORDER)
        env = dict(os.environ, COW_ANALYSIS_TRACE=str(trace.resolve()))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
        return subprocess.call(command, env=env)


def replay_once(checkout: Path, trace: Path, detail: Path | None = None) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", _CHILD, str(trace.resolve()), str(checkout), *([str(detail)] if detail else [])],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"analysis_replay: the replay in {checkout} failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def replay(trace: Path, baseline: Path | None, rounds: int, detail: Path | None = None) -> None:
    targets = [("this", ROOT)] + ([("base", baseline)] if baseline is not None else [])
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in targets}
    for round_no in range(rounds):
        for name, checkout in targets if round_no % 2 == 0 else list(reversed(targets)):
            started = time.monotonic()
            runs[name].append(replay_once(checkout, trace, detail if name == "this" else None))
            took, load = time.monotonic() - started, os.getloadavg()[0]
            print(f"round {round_no + 1} {name}: {took:.1f} s, load {load:.1f}", file=sys.stderr)
    kinds = list(runs["this"][0]["cpu"])
    header = f"{'calls':<14}" + "".join(f"{name + ' n':>10}{name + ' ms':>11}" for name, _ in targets)
    print(header + ("  this/base" if baseline is not None else ""))
    totals: dict[str, float] = {}
    for kind in [*kinds, "total"]:
        line = f"{kind:<14}"
        medians = {}
        for name, _ in targets:
            if kind == "total":
                values = [sum(run["cpu"].values()) for run in runs[name]]
                n = sum(runs[name][0]["count"].values())
            else:
                values = [run["cpu"][kind] for run in runs[name]]
                n = runs[name][0]["count"][kind]
            medians[name] = statistics.median(values) * 1000
            line += f"{n:>10}{medians[name]:>11.1f}"
        if baseline is not None:
            line += f"{medians['this'] / medians['base']:>11.3f}" if medians["base"] else f"{'-':>11}"
        totals[kind] = medians["this"]
        print(line)
    for parse in ("json", "nodes"):
        counts = "".join(f"{runs[name][0]['parses'][parse]:>21}" for name, _ in targets)
        print(f"{'parses ' + parse:<14}{counts}")
    per_text(runs, [name for name, _ in targets])


# The per-text table: what a new text (a session's text the cache did not answer) costs, by the part of it.
_PARTS = {"whole": 1, "parse": 2, "analysis": None, "rewrite": 3, "deparse": 4}


def _quantiles(values: list[float]) -> tuple[float, float]:
    """Median and 99th percentile, in µs."""
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)
    return statistics.median(ordered) * 1e6, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6


def _part(text: list[Any], part: str) -> float:
    index = _PARTS[part]
    if index is None:  # the analysis' own work: the whole less pglast's parses and the rewriter
        return float(text[1] - text[2] - text[3])
    return float(text[index])


def per_text(runs: dict[str, list[dict[str, Any]]], names: list[str]) -> None:
    """Median and p99 µs of a new text, whole and by part, for all new texts and for those the rewriter
    changed or a template answered (the median over the rounds of each round's quantile)."""
    print(f"\n{'new text µs':<26}" + "".join(f"{name + ' med':>10}{name + ' p99':>10}" for name in names))
    groups = {"all new texts": None, "rewritten or template": ("rewritten", "template")}
    for group, kinds in groups.items():
        for part in _PARTS:
            line = f"{group[:14] + ' ' + part:<26}"
            for name in names:
                medians, p99s = [], []
                for run in runs[name]:
                    texts = [t for t in run["new_texts"] if kinds is None or t[0] in kinds]
                    values = [_part(t, part) for t in texts]
                    if part in ("rewrite", "deparse"):
                        values = [v for v in values if v > 0]  # (of the texts the rewriter ran on)
                    median, p99 = _quantiles(values)
                    medians.append(median)
                    p99s.append(p99)
                line += f"{statistics.median(medians):>10.0f}{statistics.median(p99s):>10.0f}"
            print(line)
        counts = "".join(
            f"{sum(1 for t in runs[name][0]['new_texts'] if kinds is None or t[0] in kinds):>20}"
            for name in names
        )
        print(f"{group[:14] + ' texts':<26}{counts}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run a command, recording its proxies' analysis calls")
    rec.add_argument("--trace", type=Path, required=True)
    rec.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    rep = sub.add_parser("replay", help="replay a trace in this checkout (and a baseline), in turns")
    rep.add_argument("--trace", type=Path, required=True)
    rep.add_argument("--baseline", type=Path, help="another checkout with its own .venv (a worktree of main)")
    rep.add_argument("--rounds", type=int, default=5)
    rep.add_argument(
        "--detail", type=Path, help="write this checkout's calls but cache hits, costliest first"
    )
    args = parser.parse_args(argv)
    if args.command == "record":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("record needs a command after --")
        return record(args.trace, command)
    if not args.trace.exists():
        print(f"analysis_replay: no trace at {args.trace}", file=sys.stderr)
        return 2
    replay(args.trace, args.baseline, args.rounds, args.detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
