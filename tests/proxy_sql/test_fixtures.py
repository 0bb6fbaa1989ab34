"""Rewrite fixtures: ``fixtures/NAME.sql`` (input) and ``fixtures/NAME.expected.sql`` (output).

Input files may start with ``-- key: value`` option lines: ``version`` (server_version_num, default
170000), ``session`` (true/false, default true), ``allow`` (rules of the tagged connections' policy to lift,
comma-separated: ``ddl``, ``do``; default none). The expected file holds the rewritten SQL, or
``-- unchanged``, or ``-- error SQLSTATE: message`` (then ``-- detail: DETAIL`` when there is one); a
``-- tag_map: COMMAND => TEMPLATE`` line may follow the SQL. Set COW_REGEN_FIXTURES=1 to rewrite the
expected files (then review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import pglast
import pytest

from proxy.sql import Analysis, Analyzer
from proxy.sql.policy import Policy

from .catalogs import sample_catalog

FIXTURES = Path(__file__).parent / "fixtures"
CASES = sorted(p for p in FIXTURES.glob("*.sql") if not p.name.endswith(".expected.sql"))


def _options(text: str) -> tuple[dict[str, str], str]:
    options: dict[str, str] = {}
    lines = text.splitlines()
    while lines and lines[0].startswith("-- ") and ":" in lines[0]:
        key, value = lines.pop(0)[3:].split(":", 1)
        options[key.strip()] = value.strip()
    return options, "\n".join(lines).strip()


def _render(result: Analysis) -> str:
    if result.error is not None:
        detail = f"-- detail: {result.error_detail}\n" if result.error_detail else ""
        return f"-- error {result.error[0]}: {result.error[1]}\n{detail}"
    if result.rewritten is None:
        return "-- unchanged\n"
    out = result.rewritten + "\n"
    if result.tag_map is not None:
        out += f"-- tag_map: {result.tag_map[0]} => {result.tag_map[1]}\n"
    return out


def run_case(path: Path) -> str:
    options, sql = _options(path.read_text())
    policy = Policy.from_names(filter(None, options.get("allow", "").split(",")))
    analyzer = Analyzer(server_version_num=int(options.get("version", "170000")), policy=policy)
    result = analyzer.analyze(sql, sample_catalog(), in_session=options.get("session", "true") == "true")
    return _render(result)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fixture(path: Path) -> None:
    expected_path = path.with_suffix(".expected.sql")
    got = run_case(path)
    if os.environ.get("COW_REGEN_FIXTURES") == "1":
        expected_path.write_text(got)
    assert got == expected_path.read_text()
    if not got.startswith("--"):
        # the output is valid SQL that PostgreSQL's parser accepts
        sql = got.split("\n-- tag_map:")[0]
        source = pglast.parse_sql(_options(path.read_text())[1])
        assert len(pglast.parse_sql(sql)) == len(source)  # as many statements as the client sent


def test_there_are_fixtures() -> None:
    assert len(CASES) >= 20
