"""The documentation cannot drift from the code.

Fast checks: every public name has a docstring and an API-reference entry, the
error index covers every error class and the upstream messages users search
for, and the CLI reference renders every subcommand.

Slow check (``test_page_code_runs``): every ```python and ```console block of
README.md and docs/guides/*.md runs, page by page, in a scratch directory, in
subprocesses with bounded timeouts. The python blocks of a page run in one Python
process, in page order, like a notebook (one namespace: a block builds on the
earlier ones); a console block between them runs while that process waits, so a
python block after it sees what it wrote. A console block runs each ``$`` line
with bash, the venv's ``tfstrategy`` and ``python`` first on PATH. A ``$`` line
run before in the same session (the same command line, the same contents of the
files it names, and no absolute path: its effects stay in the scratch directory)
is not run again: its exit status and output, held against each page's own
expectations, and the files it left are reused (``ConsoleRuns``), so a command
several pages show costs one run. An HTML comment on the line before a block changes that:

- ``<!-- docs-test: skip REASON -->``: not run (GPU, real cluster, recursive); say why.
- ``<!-- docs-test: file NAME -->``: a python block saved as NAME for later console blocks, not run.
- ``<!-- docs-test: new-process -->``: a python block that starts a fresh process (the earlier one must exit 0),
  for a block that needs a TensorFlow runtime not yet started.
- ``<!-- docs-test: exit N -->``: every ``$`` line of the console block must exit N (default 0).
- ``<!-- docs-test: output -->``: every output line shown (other than ``...``) must appear in the real output;
  above a ``text`` block right after python code or a console block, the block is (the rest of) what it
  printed: its lines must appear in order, by ``docs_samples.py``'s rules (a measurement matches any number, a
  line ending in `` ...`` its start).

A page's own python code must run clean of Keras' ``shuffle=True was passed, but will be ignored``
warning (its ``fit`` on a dataset passes ``shuffle=False``, as the README's does): a reader copies it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import tfstrategy
import tfstrategy.errors
from docs_samples import unmatched

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
    """One step of a page: python code (consecutive python blocks), or one console command."""

    kind: str  # "python" | "console"
    text: str
    line: int
    expected_exit: int = 0
    expected_output: list[str] = field(default_factory=list)
    #: python: runs in a fresh process (the page's first python, or a ``new-process`` block), not the page's last one.
    fresh: bool = False
    #: What it prints, as the ``text`` block after it shows it (``docs_samples.py``'s rules).
    printed: list[str] = field(default_factory=list)


def blocks(page: Path) -> list[Block]:
    """The page's python and console blocks with the docs-test marker just above each."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        if language == "text" and marker is not None and marker.group(1) == "output":
            found.append(Block(language, match.group(2), line, *marker.groups()))  # the python before it printed this
        if language not in ("python", "console"):
            continue
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
    """The steps of a page, in order, and the files it saves first."""
    result: list[Segment] = []
    files: dict[str, str] = {}
    script: list[str] = []
    script_line = 0
    fresh = True  # the page's first python starts its process

    def flush() -> None:
        nonlocal script, fresh
        if script:
            result.append(Segment("python", "\n".join(script), script_line, fresh=fresh))
            script, fresh = [], False

    for block in blocks(page):
        if block.directive == "skip":
            assert block.argument, f"{page.name}:{block.line}: a skip marker needs its reason"
            continue
        if block.directive == "file":
            files[block.argument] = block.code
            continue
        if block.language == "text":
            flush()  # the code so far printed it; what follows runs on in the same process
            assert result, f"{page.name}:{block.line}: an output text block follows the code or command that prints it"
            result[-1].printed.extend(line.strip() for line in block.code.splitlines() if line.strip())
            continue
        if block.language == "python":
            if block.directive == "new-process":
                flush()
                fresh = True
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


@dataclass
class Ran:
    """What one step did: its exit status (a python step's: its code's) and its output, stdout then stderr."""

    returncode: int
    output: str
    timed_out: bool = False


#: The page's python process: ``exec`` of each code it is sent (one JSON line) in the namespace of ``__main__``, as
#: ``python -c`` runs a script (the kernel's own names are not in it); after each, a line with the marker and the
#: code's exit status (1: an exception, whose traceback it prints; sys.exit's status, and the process ends). Its
#: stderr is its stdout, so a code's output ends at its marker.
KERNEL = """
def _docs_kernel():
    import json, sys, traceback
    namespace = sys.modules["__main__"].__dict__
    del namespace["_docs_kernel"]
    for line in sys.stdin:
        status, stop = 0, False
        try:
            exec(compile(json.loads(line), "<docs>", "exec"), namespace)
        except SystemExit as exit_:
            status, stop = (exit_.code if isinstance(exit_.code, int) else exit_.code is not None), True
            if not isinstance(exit_.code, (int, type(None))):
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            status, stop = 1, True
        sys.stderr.flush()
        print("", MARKER, int(status), sep="\\n", flush=True)
        if stop:  # as a script ends at sys.exit or an uncaught exception
            sys.exit(int(status))


_docs_kernel()
"""


class PythonProcess:
    """A page's python process (:data:`KERNEL`): runs its python steps one after another."""

    def __init__(self, workdir: Path) -> None:
        self.marker = f"docs-test-end-{uuid.uuid4().hex}"
        code = KERNEL.replace("MARKER", repr(self.marker))
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], cwd=workdir, env=_environment(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read(self, until_marker: bool) -> Ran:
        deadline = time.monotonic() + BLOCK_TIMEOUT
        output: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
                if until_marker and line is not None and line.rstrip("\n") == self.marker:
                    status = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
                    if output and output[-1] == "\n":
                        output.pop()  # the marker's own line break
                    return Ran(int(status) if status else self.process.wait(), "".join(output))
            except queue.Empty:
                self.kill()
                return Ran(-9, "".join(output), timed_out=True)
            if line is None:  # the process ended
                return Ran(self.process.wait(), "".join(output))
            output.append(line)

    def run(self, code: str) -> Ran:
        try:
            self.process.stdin.write(json.dumps(code) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it ended: _read says how
        return self._read(until_marker=True)

    def close(self) -> Ran:
        """End the process as a script ends (after its last code): its exit status and what it printed then."""
        if self.process.poll() is None and not self.process.stdin.closed:
            self.process.stdin.close()
        return self._read(until_marker=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _digest(path: Path) -> str:
    """The contents of a file, or of every file under a directory."""
    if path.is_dir():
        return hashlib.sha256("\n".join(f"{p.relative_to(path)} {_digest(p)}" for p in sorted(path.rglob("*"))
                                        if p.is_file()).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(workdir: Path) -> dict[str, str]:
    """Every file of the scratch directory (not the linked examples/ and benchmarks/): path -> digest."""
    found = {}
    for folder, directories, names in os.walk(workdir):
        directories[:] = [name for name in directories if not (Path(folder) / name).is_symlink()]
        for name in names:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(workdir).as_posix()] = _digest(path)
    return found


@dataclass
class ConsoleRun:
    """A command's run, kept for the session: exit status, output and the scratch files it wrote or removed."""

    ran: Ran
    wrote: dict[str, bytes]
    removed: list[str]


class ConsoleRuns:
    """The session's console commands, by command line and the contents of the files it names.

    A command that names an absolute path (its effects may outlive its scratch directory) is never reused.
    """

    def __init__(self) -> None:
        self.runs: dict[tuple[str, tuple[tuple[str, str], ...]], ConsoleRun] = {}
        self.reused = 0

    @staticmethod
    def key(command: str, workdir: Path) -> tuple[str, tuple[tuple[str, str], ...]] | None:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = {part for word in lexer for part in (word, *re.split(r"[=,:]", word)) if part}
        if any(os.path.isabs(word) for word in words):
            return None
        named = sorted(word for word in words if (workdir / word).exists())
        return command, tuple((word, _digest(workdir / word)) for word in named)

    def run(self, command: str, workdir: Path) -> Ran:
        key = self.key(command, workdir)
        if key is not None and key in self.runs:
            kept = self.runs[key]
            for name, content in kept.wrote.items():
                (workdir / name).parent.mkdir(parents=True, exist_ok=True)
                (workdir / name).write_bytes(content)
            for name in kept.removed:
                (workdir / name).unlink(missing_ok=True)
            self.reused += 1
            return kept.ran
        before = _snapshot(workdir)
        ran = _run_command(command, workdir)
        if key is not None and not ran.timed_out:
            after = _snapshot(workdir)
            wrote = {name: (workdir / name).read_bytes() for name, digest in after.items() if before.get(name) != digest}
            self.runs[key] = ConsoleRun(ran, wrote, [name for name in before if name not in after])
        return ran


CONSOLE_RUNS = ConsoleRuns()


def _run_command(command: str, workdir: Path) -> Ran:
    try:
        done = subprocess.run(["bash", "-c", command], cwd=workdir, env=_environment(), capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as error:
        out = error.stdout.decode(errors="replace") if isinstance(error.stdout, bytes) else (error.stdout or "")
        return Ran(-9, out, timed_out=True)
    return Ran(done.returncode, done.stdout + done.stderr)


def check_step(segment: Segment, ran: Ran, label: str) -> None:
    """Hold what a step did to what the page says: its exit status, the output it shows, no shuffle warning."""
    shown = segment.text if segment.kind == "python" else f"$ {segment.text}"
    if ran.timed_out:
        pytest.fail(f"{label}: still running after {BLOCK_TIMEOUT} s:\n{shown}\n{ran.output[-4000:]}")
    context = f"{label}:\n{shown}\n--- exit {ran.returncode}, output:\n{ran.output[-4000:]}"
    assert ran.returncode == segment.expected_exit, f"expected exit {segment.expected_exit}; {context}"
    actual = {line.rstrip() for line in ran.output.splitlines()}
    missing = [line for line in segment.expected_output if line not in actual]
    assert not missing, f"lines shown in the docs but not printed: {missing}; {context}"
    unprinted = unmatched(segment.printed, ran.output)
    assert not unprinted, f"the output shown in the docs, from {unprinted[0]!r} on, was not printed in order; {context}"
    if segment.kind == "python":
        assert KERAS_SHUFFLE_WARNING not in ran.output, f"a fit on a dataset needs shuffle=False; {context}"


def run_page(found: list[Segment], workdir: Path, label: str) -> None:
    """Run a page's steps in order: its python in one process (a fresh one at each ``fresh`` step)."""
    python: PythonProcess | None = None
    last: tuple[Segment, str] | None = None  # the python step the process ran last, for its exit

    def end_python() -> None:
        nonlocal python
        if python is not None:
            ended = python.close()
            segment, where = last
            check_step(segment, ended, f"{where}, at the exit of its process")
            python = None

    try:
        for number, segment in enumerate(found, 1):
            where = f"{label}:{segment.line} (segment {number})"
            if segment.kind == "console":
                check_step(segment, CONSOLE_RUNS.run(segment.text, workdir), where)
                continue
            if segment.fresh or python is None or not python.alive():
                end_python()
                python = PythonProcess(workdir)
            last = (segment, where)
            check_step(segment, python.run(segment.text), where)
        end_python()
    finally:
        if python is not None:
            python.kill()


@pytest.mark.slow
@pytest.mark.over_ceiling(seconds=180, reason="a page runs its blocks in turn; the README trains its quick start three ways")
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    found, files = segments(page)
    for name in ("examples", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    run_page(found, tmp_path, str(page.relative_to(ROOT)))


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


def test_python_blocks_share_one_process_until_new_process(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\na = 1\n```\n\n```python\nb = 2\n```\n\n```console\n$ echo hi\nhi\n```\n\n"
                    "```python\nc = 3\n```\n\n<!-- docs-test: new-process -->\n```python\nd = 4\n```\n")
    found, _ = segments(page)
    assert [(segment.kind, segment.text, segment.fresh) for segment in found] == [
        ("python", "a = 1\n\nb = 2\n", True), ("console", "echo hi", False), ("python", "c = 3\n", False),
        ("python", "d = 4\n", True)]


def test_python_process_runs_steps_like_one_script(tmp_path) -> None:
    process = PythonProcess(tmp_path)
    try:
        assert process.run("x = 1\nprint('one', end='')") == Ran(0, "one\n")
        names = "print(sorted(name for name in globals() if not name.startswith('__')), __name__)"
        assert process.run(names) == Ran(0, "['x'] __main__\n")  # the script's names only, as in python -c
        pickled = "import pickle\ndef f():\n    return x\nprint(pickle.loads(pickle.dumps(f))())"
        assert process.run(pickled) == Ran(0, "1\n")  # its functions live in __main__, as a script's do
        (tmp_path / "f.txt").write_text("written between\n")  # as a console step would
        assert process.run("print(x + 1, open('f.txt').read().strip())") == Ran(0, "2 written between\n")
        failed = process.run("import sys\nprint('to stderr', file=sys.stderr)\nraise ValueError('boom')")
        assert failed.returncode == 1 and "to stderr" in failed.output and "ValueError: boom" in failed.output
        assert process.close().returncode == 1  # the script ended at the uncaught exception
    finally:
        process.kill()
    process = PythonProcess(tmp_path)
    try:
        assert process.run("import sys\nsys.exit(3)").returncode == 3
        assert not process.alive() or process.close().returncode == 3
    finally:
        process.kill()
    process = PythonProcess(tmp_path)
    try:
        assert process.run("import atexit\natexit.register(lambda: print('bye'))") == Ran(0, "")
        assert process.close() == Ran(0, "bye\n")
    finally:
        process.kill()


def test_console_runs_reuse_a_command_with_the_same_files(tmp_path) -> None:
    runs = ConsoleRuns()
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for folder in (first, second, third):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "in.txt").write_text("same\n")
        (folder / "gone.txt").write_text("x")
    (third / "data" / "in.txt").write_text("other\n")
    command = "cat data/in.txt; echo $RANDOM$RANDOM > out.txt; rm gone.txt; exit 4"
    ran = runs.run(command, first)
    assert ran.returncode == 4 and ran.output.startswith("same\n") and runs.reused == 0
    assert runs.run(command, second) == ran and runs.reused == 1
    assert (second / "out.txt").read_text() == (first / "out.txt").read_text() and not (second / "gone.txt").exists()
    assert runs.run(command, third).output.startswith("other\n") and runs.reused == 1  # another file, another run
    absolute = f"echo $RANDOM$RANDOM > {tmp_path}/abs.txt"
    runs.run(absolute, first)
    runs.run(absolute, second)
    assert runs.reused == 1  # an absolute path: never reused
