"""Every Markdown file of the repository renders as its author meant (issue 35).

Each file is parsed with a CommonMark parser (markdown-it-py), as GitHub and the docs site read it:
a code fence that never closes (or closes on a line carrying text, which CommonMark does not accept,
so the fence swallows the rest of the page) fails, and so does a relative link to a file or a heading
anchor that does not exist. Links from docs/ may also name the files the site publishes from outside
docs/ (``ROOT_FILES`` in docs/hooks/site.py).
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Folders that hold no Markdown of ours (virtual environments, build output, caches).
SKIPPED_DIRS = {"site", "build", "dist", "node_modules", "__pycache__"}


def markdown_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts[:-1]
        if any(part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
            continue
        found.append(path)
    return found


FILES = markdown_files()


@cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


@cache
def _published_outside_docs() -> dict[str, str]:
    """Site path -> repository path of the files the site publishes from outside docs/."""
    spec = importlib.util.spec_from_file_location("docs_site_hook_for_links", DOCS / "hooks" / "site.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**{path: path for path in module.ROOT_FILES}, module.README_PAGE: "README.md"}


def fence_problems(text: str) -> list[str]:
    """Fences that run on past where their author ended them, as ``line N: why``."""
    lines = text.splitlines()
    problems = []
    for token in _parser().parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        char, width = token.markup[0], len(token.markup)
        closing = re.compile(rf"^[ \t>]*{re.escape(char)}{{{width},}}[ \t]*$")
        last = lines[end - 1] if end - 1 < len(lines) else ""
        if end - 1 == start or not closing.match(last):
            problems.append(f"line {start + 1}: the {token.markup} fence is never closed")
            continue
        # A line inside the block that starts like a fence of this kind was meant to end it (or to open
        # the next block): CommonMark rejects text after a closing fence, so the block ran on.
        opener = re.compile(rf"^[ \t>]*{re.escape(char)}{{{width},}}")
        for number in range(start + 1, end - 1):
            if opener.match(lines[number]):
                problems.append(f"line {number + 1}: {lines[number].strip()[:60]!r} does not close the "
                                f"{token.markup} fence opened on line {start + 1} (a closing fence stands alone)")
    return problems


def _plain_text(token: Token) -> str:
    return "".join(child.content for child in token.children or [] if child.type in ("text", "code_inline"))


def _slugs(title: str) -> set[str]:
    """The anchors a heading gets: MkDocs' ``toc`` slug and GitHub's."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_title).strip().lower())
    github = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
    return {mkdocs, github}


@cache
def anchors(path: Path) -> frozenset[str]:
    tokens = _parser().parse(path.read_text())
    found: set[str] = set()
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            title = _plain_text(tokens[index + 1])
            explicit = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", title)  # attr_list: ## Title {#id}
            if explicit:
                found.add(explicit.group(1))
                title = title[: explicit.start()]
            found |= _slugs(title)
    found |= set(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", path.read_text()))
    return frozenset(found)


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link and image in the text."""
    found = []
    for token in _parser().parse(text):
        if token.type != "inline":
            continue
        line = token.map[0] + 1 if token.map else 0
        for child in token.children or []:
            if child.type == "link_open":
                found.append((line, str(child.attrs.get("href", ""))))
            elif child.type == "image":
                found.append((line, str(child.attrs.get("src", ""))))
    return found


def link_problems(page: Path) -> list[str]:
    published = _published_outside_docs()
    problems = []
    for line, target in links(page.read_text()):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or target.startswith("mailto:"):
            continue
        relative = unquote(parts.path)
        destination = (page.parent / relative).resolve() if relative else page
        if relative and not destination.exists() and page.is_relative_to(DOCS):
            # The site publishes some files from outside docs/ at the same path below the site root.
            inside = destination.relative_to(DOCS) if destination.is_relative_to(DOCS) else None
            if inside is not None and inside.as_posix() in published:
                destination = ROOT / published[inside.as_posix()]
        if not destination.exists():
            problems.append(f"line {line}: {target} -> no file {relative}")
            continue
        if parts.fragment and destination.suffix == ".md" and parts.fragment not in anchors(destination):
            problems.append(f"line {line}: {target} -> {destination.name} has no heading #{parts.fragment}")
    return problems


def test_every_markdown_file_is_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in FILES}
    assert {"README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "benchmarks/README.md", "docs/index.md"} <= names


@pytest.mark.parametrize("page", FILES, ids=[path.relative_to(ROOT).as_posix() for path in FILES])
def test_fences_close(page: Path) -> None:
    problems = fence_problems(page.read_text())
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", FILES, ids=[path.relative_to(ROOT).as_posix() for path in FILES])
def test_relative_links_resolve(page: Path) -> None:
    problems = link_problems(page)
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("```console\n$ a\n```\n", [], id="closed"),
    pytest.param("````md\n```python\nx\n```\n````\n", [], id="nested-in-a-longer-fence"),
    pytest.param("```console\n$ a\n``` more text\n\n## Next\n", ["line 1"], id="text-after-the-close"),
    pytest.param("text\n```python\nx = 1\n", ["line 2"], id="never-closed"),
])
def test_fence_checker(text: str, expected: list[str]) -> None:
    problems = fence_problems(text)
    assert [problem.split(":")[0] for problem in problems] == expected, problems


def test_link_checker_sees_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Set-up, step 1\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#set-up-step-1) [bad](a.md#setup) [gone](c.md) [here](#b)\n\n# B\n")
    problems = link_problems(page)
    assert [problem.split(" -> ")[0] for problem in problems] == ["line 1: a.md#setup", "line 1: c.md"]


def test_the_readme_commands_table_has_a_row_for_every_subcommand():
    from tfstrategy.cli import build_parser

    spec = importlib.util.spec_from_file_location("site_hook", ROOT / "docs" / "hooks" / "site.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Commands", 1)[1].split("\n\n", 2)[1]
    rows = [re.match(r"\| `tfstrategy (\S+)", line) for line in table.splitlines()]
    assert [row.group(1) for row in rows if row] == hook.subcommands(build_parser())
