"""The documentation cannot drift from the code.

Fast checks: every public name has a docstring and an API-reference entry, the
error index covers every error class and the upstream messages users search
for, and the CLI reference renders every subcommand.

Slow check (``test_page_code_runs``): every ```python and ```console block of
README.md and docs/guides/*.md runs, page by page, in a scratch directory, in
subprocesses with bounded timeouts. Consecutive python blocks of a page run as
one script (like a notebook), so a page can build on its earlier blocks, up to
the next console block, which ends that script (python blocks after it start a
fresh one); a console block runs each ``$`` line with bash, the venv's
``tfstrategy`` and ``python`` first on PATH. An HTML comment on the line before a block changes that:

- ``<!-- docs-test: skip REASON -->``: not run (GPU, real cluster, recursive); say why.
- ``<!-- docs-test: file NAME -->``: a python block saved as NAME for later console blocks, not run.
- ``<!-- docs-test: new-process -->``: a python block that starts a fresh script.
- ``<!-- docs-test: exit N -->``: every ``$`` line of the console block must exit N (default 0).
- ``<!-- docs-test: output -->``: every output line shown (other than ``...``) must appear in the real output.

A page's own python code must run clean of Keras' ``shuffle=True was passed, but will be ignored``
warning (its ``fit`` on a dataset passes ``shuffle=False``, as the README's does): a reader copies it.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tfstrategy
import tfstrategy.errors

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted((DOCS / "guides").glob("*.md"))]
#: Seconds one script or one command may take (a launch of 2 workers that train is the slowest).
BLOCK_TIMEOUT = 240
#: TensorFlow's messages the error index must answer (issue 15).
UPSTREAM_MESSAGES = (
    "Mixing different tf.distribute.Strategy objects",
    "You must feed a value for placeholder tensor",
    "Attempt to convert a value (PerReplica",
    "Invalid reduction dimension 0",
    "Virtual devices cannot be modified after being initialized",
    "Shape mismatch in the collective instance",
    "Inputs to operation AddN",
)

#: Keras 3's warning for ``fit(dataset)`` without ``shuffle=False``: the dataset sets the order.
KERAS_SHUFFLE_WARNING = "`shuffle=True` was passed, but will be ignored"

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*docs-test:\s*(\S+)\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    language: str
    code: str
    line: int
    directive: str = ""
    argument: str = ""


@dataclass
class Segment:
    """What one subprocess runs: a python script, or one console command."""

    kind: str  # "python" | "console"
    text: str
    line: int
    expected_exit: int = 0
    expected_output: list[str] = field(default_factory=list)


def blocks(page: Path) -> list[Block]:
    """The page's python and console blocks with the docs-test marker just above each."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in ("python", "console"):
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(Block(language, match.group(2), line, *(marker.groups() if marker else ("", ""))))
    return found


def console_commands(code: str) -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` for each ``$`` line (``\\`` continues it)."""
    commands: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.startswith("$ "):
            if commands:
                commands[-1][1].append(line.rstrip())
            continue
        command = line[2:]
        while command.endswith("\\") and index < len(lines):
            command = command[:-1].rstrip() + " " + lines[index].strip()
            index += 1
        commands.append((command, []))
    return commands


def segments(page: Path) -> tuple[list[Segment], dict[str, str]]:
    """The subprocesses a page needs, in order, and the files it saves first."""
    result: list[Segment] = []
    files: dict[str, str] = {}
    script: list[str] = []
    script_line = 0

    def flush() -> None:
        nonlocal script
        if script:
            result.append(Segment("python", "\n".join(script), script_line))
            script = []

    for block in blocks(page):
        if block.directive == "skip":
            assert block.argument, f"{page.name}:{block.line}: a skip marker needs its reason"
            continue
        if block.directive == "file":
            files[block.argument] = block.code
            continue
        if block.language == "python":
            if block.directive == "new-process":
                flush()
            if not script:
                script_line = block.line
            script.append(block.code)
            continue
        flush()
        expected_exit = int(block.argument) if block.directive == "exit" else 0
        for command, shown in console_commands(block.code):
            expected = [line for line in shown if line.strip() and line.strip() != "..."]
            result.append(Segment("console", command, block.line, expected_exit,
                                  expected if block.directive == "output" else []))
    flush()
    return result, files


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    for key in [key for key in env if key.startswith(("TFSTRATEGY_", "TF_CONFIG", "SLURM_"))]:
        del env[key]
    return env


def run_segment(segment: Segment, workdir: Path, label: str) -> None:
    if segment.kind == "python":
        argv = [sys.executable, "-c", segment.text]
        shown = segment.text
    else:
        argv = ["bash", "-c", segment.text]
        shown = f"$ {segment.text}"
    try:
        done = subprocess.run(argv, cwd=workdir, env=_environment(), capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{label}: still running after {BLOCK_TIMEOUT} s:\n{shown}\n{error.stdout or ''}")
    output = done.stdout + done.stderr
    context = f"{label}:\n{shown}\n--- exit {done.returncode}, output:\n{output[-4000:]}"
    assert done.returncode == segment.expected_exit, f"expected exit {segment.expected_exit}; {context}"
    actual = {line.rstrip() for line in output.splitlines()}
    missing = [line for line in segment.expected_output if line not in actual]
    assert not missing, f"lines shown in the docs but not printed: {missing}; {context}"
    if segment.kind == "python":
        assert KERAS_SHUFFLE_WARNING not in output, f"a fit on a dataset needs shuffle=False; {context}"


@pytest.mark.slow
@pytest.mark.over_ceiling(seconds=300, reason="a page runs its blocks in turn; the README trains its quick start three ways")
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    found, files = segments(page)
    for name in ("examples", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    for number, segment in enumerate(found, 1):
        run_segment(segment, tmp_path, f"{page.relative_to(ROOT)}:{segment.line} (segment {number})")


# -- fast checks ---------------------------------------------------------------------------------


def test_every_page_parses_and_skips_are_few() -> None:
    skips = []
    for page in PAGES:
        segments(page)  # asserts every skip has a reason
        skips += [f"{page.name}:{block.line}" for block in blocks(page) if block.directive == "skip"]
    assert len(skips) <= 12, f"too many blocks skipped (keep them few and justified): {skips}"


def test_console_commands_split() -> None:
    commands = console_commands("$ tfstrategy check \\\n  --json\n{...}\n$ tfstrategy env\n...\n- x\n")
    assert commands == [("tfstrategy check --json", ["{...}"]), ("tfstrategy env", ["...", "- x"])]


def test_public_names_have_docstrings() -> None:
    missing = [name for name in tfstrategy.__all__ if not inspect.getdoc(getattr(tfstrategy, name))]
    error_classes = [cls for _, cls in inspect.getmembers(tfstrategy.errors, inspect.isclass)
                     if issubclass(cls, tfstrategy.errors.TFStrategyError)]
    missing += [cls.__name__ for cls in error_classes if not cls.__doc__]
    assert not missing, f"public names without a docstring: {missing}"


def test_api_reference_lists_every_public_name() -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    listed = set(re.findall(r"^::: tfstrategy\.(\w+)\s*$", page, re.M))
    assert set(tfstrategy.__all__) <= listed, f"not in docs/reference/api.md: {set(tfstrategy.__all__) - listed}"


def test_error_index_answers_every_error() -> None:
    page = (DOCS / "reference" / "errors.md").read_text()
    headings = "\n".join(line for line in page.splitlines() if line.startswith("#"))
    classes = [name for name, cls in inspect.getmembers(tfstrategy.errors, inspect.isclass)
               if issubclass(cls, tfstrategy.errors.TFStrategyError)]
    missing = [name for name in classes if name not in headings]
    missing += [message for message in UPSTREAM_MESSAGES if message not in headings]
    assert not missing, f"docs/reference/errors.md has no heading for: {missing}"


def _site_hook():
    spec = importlib.util.spec_from_file_location("docs_site_hook", DOCS / "hooks" / "site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_renders_every_subcommand() -> None:
    hook = _site_hook()
    from tfstrategy.cli import build_parser

    names = hook.subcommands(build_parser())
    assert names == ["check", "env", "run", "launch"] or set(names) >= {"check", "env", "run", "launch"}
    rendered = hook.render_cli_reference()
    for name in names:
        assert f"## tfstrategy {name}\n" in rendered
        assert f"usage: tfstrategy {name}" in rendered


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/"


def test_console_blocks_quote_like_bash() -> None:
    # The runner hands each `$` line to bash as written; a line bash cannot split is a typo in the docs.
    for page in PAGES:
        for block in blocks(page):
            if block.language == "console" and block.directive != "skip":
                for command, _ in console_commands(block.code):
                    shlex.split(command, comments=True)


def test_readme_links_resolve() -> None:
    # README.md is not part of the site, so mkdocs --strict does not see its links.
    text = (ROOT / "README.md").read_text()
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target]
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert targets and not missing, f"README.md links to missing files: {missing}"


def test_docs_home_links_every_guide_and_the_set_up() -> None:
    # Issue 35: the "I want to..." table had no "why is my job slow", no Ray, no link to the set-up.
    page = (DOCS / "index.md").read_text()
    table = "\n".join(line for line in page.splitlines() if line.startswith("| "))
    linked = {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", table)}
    guides = {f"guides/{path.name}" for path in (DOCS / "guides").glob("*.md")}
    assert guides <= linked, f"docs/index.md's task table does not link {sorted(guides - linked)}"
    assert "start.md" in linked, "docs/index.md's task table does not link the set-up (start.md, the README)"


def test_docs_build_publishes_no_hook_code() -> None:
    # mkdocs copies every non-Markdown file of docs/ into the site unless exclude_docs names it.
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    excluded = [line.strip().strip("/") for line in str(config.get("exclude_docs", "")).splitlines() if line.strip()]
    code = [path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.py")]
    published = [path for path in code if not any(path.startswith(f"{prefix}/") for prefix in excluded)]
    assert code and not published, f"the docs build would copy {published} into the site; add them to exclude_docs"
