"""The tables the docs publish are the tables of committed reports, regenerated from their results.json.

A published comparison lives in docs/reports/NAME/ (report.md, results.json, results.csv and figures, as nmt-compare
wrote them). The pages that quote one (README.md, docs/compare.md) mark the quote with
`<!-- report: docs/reports/NAME -->` ... `<!-- /report -->`; every table row inside must be a row of that report's
main table, and the report's main table must be what its results.json gives today. A change that moves a published
number therefore fails here until the comparison is run again and its folder replaced
(tests/test_toy_learning.py guards the training side of the toy comparison).
"""

import json
import re
from pathlib import Path

import pytest

from nmt.compare.markdown import main_table

ROOT = Path(__file__).resolve().parents[1]
QUOTE = re.compile(r"<!-- report: (\S+) -->\n(.*?)<!-- /report -->", re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quotes() -> list[tuple[Path, str, str]]:
    found = []
    for page in PAGES:
        if page.is_file():
            found += [(page, folder, body) for folder, body in QUOTE.findall(page.read_text(encoding="utf-8"))]
    return found


def table_rows(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip().startswith("|") and not set(line.strip()) <= set("|-: ")
    ]


def test_some_page_quotes_a_report():
    assert quotes(), "README.md or docs/*.md should quote a committed report (<!-- report: docs/reports/NAME -->)"


@pytest.mark.parametrize(
    "page,folder,body", quotes() or [(None, None, None)], ids=lambda v: str(v)[-40:] if v else "none"
)
def test_quoted_rows_are_the_reports_rows_and_the_report_is_its_results(page, folder, body):
    if page is None:
        pytest.skip("no quote")
    report = ROOT / folder
    summary = json.loads((report / "results.json").read_text(encoding="utf-8"))
    regenerated = table_rows(main_table(summary))
    written = (report / "report.md").read_text(encoding="utf-8").split("## Main results")[1].split("How to read it")[0]
    assert table_rows(written) == regenerated, f"{folder}/report.md no longer matches its results.json"
    normalise = lambda row: re.sub(r"\s+", " ", row)  # noqa: E731 (a quote may pad columns differently)
    quoted = [normalise(r) for r in table_rows(body)]
    assert quoted, f"{page.name}: the quote of {folder} holds no table rows"
    assert normalise(regenerated[0]) == quoted[0], f"{page.name}: the quoted header differs from {folder}'s"
    for row in quoted[1:]:
        assert row in {normalise(r) for r in regenerated}, f"{page.name}: row not in {folder}'s main table: {row}"
