"""Wall time of ``cowproxy demo`` and what routing through the proxy costs it, side by side in one run.

One embedded PostgreSQL for all runs; each run creates and drops its own database. Variants: sessions routed
through the proxy (admin route) and sessions tagged with startup options (no proxy). Per variant, the
median over ``--repeat`` runs of the whole demo and of the agents' HTTP phase.

    .venv/bin/python bench/demo_run.py --repeat 3
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

# bench/ holds scripts named like the packages (bench/scoring.py): import the packages, not the scripts.
sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]

from demo import agents, harness, workflows  # noqa: E402
from migrations.embedded import embedded_postgres  # noqa: E402


def _phase(output: str, start: str, end: str) -> float:
    times = {m.group(2): float(m.group(1)) for m in re.finditer(r"^\s*([\d.]+)s\s+\[(\d)/9\]", output, re.M)}
    return times[end] - times[start]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    chosen = workflows.QUICK if args.quick else tuple(w.slug for w in workflows.WORKFLOWS)
    names = tuple(cls.name for cls in agents.SCRIPTED)
    rows: dict[str, list[tuple[float, float]]] = {"proxy (admin route)": [], "startup options (no proxy)": []}
    with embedded_postgres() as server, TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for label, use_proxy in (("proxy (admin route)", True), ("startup options (no proxy)", False)):
                out = io.StringIO()
                cfg = harness.DemoConfig(
                    workflows=chosen,
                    agent_names=names,
                    report_path=Path(tmp) / "r.html",
                    server_dsn=server.dsn("postgres"),
                    use_proxy=use_proxy,
                    out=out,
                )
                t0 = time.perf_counter()
                result = harness.run(cfg)
                wall = time.perf_counter() - t0
                # steps 6-7: ground truth and agents, all through the application's HTTP API
                rows[label].append((wall, _phase(out.getvalue(), "6", "8")))
                sessions = len(result.scores) + len(result.gt_rows)
    print(f"{len(chosen)} workflows, {len(names)} agents, {sessions} sessions, median of {args.repeat}")
    print(f"{'variant':<30} {'demo wall s':>12} {'GT+agents s':>12} {'ratio':>7}")
    base = statistics.median(r[1] for r in rows["startup options (no proxy)"])
    for label, values in rows.items():
        wall = statistics.median(v[0] for v in values)
        phase = statistics.median(v[1] for v in values)
        print(f"{label:<30} {wall:12.2f} {phase:12.2f} {phase / base:7.2f}")


if __name__ == "__main__":
    main()
