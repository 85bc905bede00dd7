"""MkDocs hook: pages generated at build time, so they cannot drift from the code.

- ``<!-- cli-reference -->`` in a page becomes the ``--help`` of ``tfstrategy``
  and of every subcommand, rendered from :func:`tfstrategy.cli.build_parser`.
- ARCHITECTURE.md, CONTRIBUTING.md and benchmarks/README.md (with its plot)
  live beside the code they describe; they are added to the site as they are.
- README.md (set-up and quick start) is the site's ``start.md``, its ``docs/...``
  links made relative to the site.
- After the build, every link between the site's own pages names a file that exists, so the site
  browses from disk (``file://``, where a folder link shows a directory listing, not its page).
"""

from __future__ import annotations

import argparse
import html
import contextlib
import io
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- cli-reference -->"
#: Files outside docs/ that the site publishes under the same relative path.
ROOT_FILES = ("ARCHITECTURE.md", "CONTRIBUTING.md", "benchmarks/README.md", "benchmarks/latest/results.png")
#: The site's page for the README (set-up and quick start).
README_PAGE = "start.md"


def _help(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """What ``tfstrategy ARGV --help`` prints, at a fixed width."""
    out = io.StringIO()
    saved = {key: os.environ.get(key) for key in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS="100", NO_COLOR="1")  # argparse wraps to COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            parser.parse_args([*argv, "--help"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return out.getvalue().rstrip()


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommand names registered on the root parser, in order."""
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def render_cli_reference() -> str:
    """Markdown with one section per command, each its ``--help`` text."""
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from tfstrategy.cli import build_parser

    parser = build_parser()
    parts = ["## tfstrategy", "", "```text", _help(parser, []), "```", ""]
    for name in subcommands(build_parser()):
        parts += [f"## tfstrategy {name}", "", "```text", _help(build_parser(), [name]), "```", ""]
    return "\n".join(parts)


def on_files(files, config):
    from mkdocs.structure.files import File

    for relative in ROOT_FILES:
        files.append(File.generated(config, relative, abs_src_path=str(ROOT / relative)))
    files.append(File.generated(config, README_PAGE, abs_src_path=str(ROOT / "README.md")))
    return files


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render_cli_reference())
    if page.file.src_uri == README_PAGE:
        markdown = re.sub(r"\]\(docs/", "](", markdown)  # the README links docs/guides/x.md; the site has guides/x.md
    return markdown


#: A link in a built page: an ``href`` or ``src`` to the site's own files (no scheme, no leading ``#``).
_LOCAL_LINK = re.compile(r'(?:href|src)="(?![a-z][a-z0-9+.-]*:|#|//)([^"#?]+)')


def on_post_build(config):
    """Fail the build when a page links a folder or a missing file (opened from disk, both are dead)."""
    site = Path(config["site_dir"])
    dead = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":
            continue  # a server's page for a missing address: its links are absolute, from the server's root
        for link in set(_LOCAL_LINK.findall(page.read_text(errors="replace"))):
            target = (page.parent / html.unescape(link)).resolve()
            if not target.is_file():
                dead.append(f"{page.relative_to(site)} -> {link}")
    if dead:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{len(dead)} link(s) in the built site name no file (opened from disk they are dead): "
                          + "; ".join(dead[:10]) + ". Link the page's .md file, not its folder.")
