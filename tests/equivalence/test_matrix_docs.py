"""docs/reference/equivalence.md shows the matrix the suite runs, and the matrix's own tables agree."""

from __future__ import annotations

import matrix_cells
from helpers import ROOT


def test_the_page_holds_the_table_the_matrix_renders():
    page = matrix_cells.page_table(matrix_cells.DOCS_PAGE.read_text())
    assert page == matrix_cells.render_table(), (
        "docs/reference/equivalence.md is out of date; rewrite it with "
        "`PYTHONPATH=src .venv/bin/python tests/equivalence/matrix_cells.py --write-docs`")


def test_the_page_is_in_the_site_nav():
    assert "reference/equivalence.md" in (ROOT / "mkdocs.yml").read_text()


def test_every_row_has_one_outcome():
    # A row (a cell, or a group's run of it) is known to differ (KNOWN), measured equal (MEASURED_EQUAL) or refused
    # (REFUSED): one, never two.
    ids = [one.id for one in matrix_cells.CELLS]
    rows = ids + matrix_cells.group_rows()
    assert len(set(ids)) == len(ids)
    outcomes = [set(matrix_cells.KNOWN), set(matrix_cells.MEASURED_EQUAL), set(matrix_cells.REFUSED)]
    assert set.union(*outcomes) == set(rows)
    assert sum(len(one) for one in outcomes) == len(rows)
    assert {one.why for one in matrix_cells.CELLS} <= set(matrix_cells.WHY)
