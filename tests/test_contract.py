"""The worker-launcher contract (``tfstrategy.contract``): both sides import it, it imports nothing back.

Static where it is about layering (imports read with ``ast``, nothing imported), so a layer crossed
fails here whatever the import's place in a file; and the one exit-status table held to what derives
from it (the launcher's outcomes, the Kubernetes Job, the help, the docs).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "tfstrategy"
#: What contract/ may import of tfstrategy besides itself: the leaves every layer stands on.
CONTRACT_MAY_IMPORT = {"tfstrategy.errors", "tfstrategy.settings"}
#: The worker's side, which must not reach into the launcher's.
WORKER_SIDE = ("runtime", "multiworker", "environments")
LAUNCHER_SIDE = ("tfstrategy.launch", "tfstrategy.kubernetes", "tfstrategy.cli")
#: The numbers that are only ever exit statuses in tfstrategy's code (0, 1 and 2 are many other things too).
DISTINCT_CODES = (42, 75, 124, 125)
#: 128 + N, the shell's status of a process ended by signal N (elsewhere 128 is, say, a socket's backlog).
SIGNAL_BASE = 128


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (``from a import b`` counts ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path).rpartition(".")[0] if path.name != "__init__.py" else _module_name(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _files(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_contract_imports_nothing_of_tfstrategy_back_and_no_tensorflow():
    crossed = {}
    for path in _files("contract"):
        outside = {name for name in _imports(path)
                   if (_is_under(name, "tfstrategy") and not _is_under(name, "tfstrategy.contract")
                       and not any(_is_under(name, allowed) for allowed in CONTRACT_MAY_IMPORT))
                   or name.split(".")[0] in ("tensorflow", "keras", "tf_keras")}
        if outside:
            crossed[path.relative_to(ROOT).as_posix()] = sorted(outside)
    assert crossed == {}, f"contract/ must import only {sorted(CONTRACT_MAY_IMPORT)} of tfstrategy: {crossed}"
    assert _files("contract"), "no contract/ package found"


@pytest.mark.parametrize("side", WORKER_SIDE)
def test_the_worker_side_imports_nothing_of_the_launcher_side(side):
    crossed = {}
    for path in _files(side):
        reached = {name for name in _imports(path) if any(_is_under(name, launcher) for launcher in LAUNCHER_SIDE)}
        if reached:
            crossed[path.relative_to(ROOT).as_posix()] = sorted(reached)
    assert crossed == {}, f"{side}/ must reach the launcher only through tfstrategy.contract: {crossed}"


def _is_int(node: ast.AST, values: tuple[int, ...]) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value in values


def _int_constants(path: Path) -> list[tuple[int, int]]:
    """The exit-status numbers ``path`` writes: each distinct code, and 128 in a sum or difference (128+N)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [(node.value, node.lineno) for node in ast.walk(tree) if _is_int(node, DISTINCT_CODES)]
    found += [(SIGNAL_BASE, node.lineno) for node in ast.walk(tree)
              if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
              and (_is_int(node.left, (SIGNAL_BASE,)) or _is_int(node.right, (SIGNAL_BASE,)))]
    return found


def test_each_exit_status_number_is_written_once_in_the_contracts_table():
    from tfstrategy.contract.exits import EXIT_STATUSES

    codes = [status.code for status in EXIT_STATUSES]
    assert len(codes) == len(set(codes)), codes
    assert {*DISTINCT_CODES, SIGNAL_BASE} <= set(codes)
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        written += [f"{path.relative_to(ROOT)}:{line} writes {value}" for value, line in _int_constants(path)]
    # The table's own rows are plain ``code=`` values, not sums: only the distinct codes show, once each.
    table = [f"src/tfstrategy/contract/exits.py:{line} writes {value}"
             for value, line in _int_constants(PACKAGE / "contract" / "exits.py")]
    assert sorted(written) == sorted(table), "take exit statuses from tfstrategy.contract.exits"
    assert Counter(value for value, _ in _int_constants(PACKAGE / "contract" / "exits.py")) == dict.fromkeys(
        DISTINCT_CODES, 1)


def test_no_module_but_the_contract_gives_an_exit_status_a_number():
    named = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "contract" / "exits.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                    and type(node.value.value) is int:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named += [f"{path.relative_to(ROOT)}:{node.lineno} {target.id}" for target in targets
                          if isinstance(target, ast.Name) and re.search(r"EXIT|STATUS", target.id)]
    assert named == []


def test_every_outcome_has_one_status_in_the_table_and_exits_with_it():
    import signal

    from tfstrategy.contract.exits import EXIT_STATUSES, status_of_outcome
    from tfstrategy.launch.states import Outcome

    listed = Counter(outcome for status in EXIT_STATUSES for outcome in status.outcomes)
    assert listed == dict.fromkeys((outcome.value for outcome in Outcome), 1)
    for outcome in Outcome:
        status = status_of_outcome(outcome.value)
        expected = status.code + signal.SIGTERM if status.plus_signal else status.code
        assert outcome.exit_status() == expected, outcome


def test_the_pod_failure_policy_is_the_tables_kubernetes_column():
    from tfstrategy.contract.exits import EXIT_STATUSES, PodAction
    from tfstrategy.kubernetes.manifests import pod_failure_policy

    by_exit = {rule["action"]: rule["onExitCodes"]["values"] for rule in pod_failure_policy()["rules"]
               if "onExitCodes" in rule}
    assert by_exit == {action.value: sorted(status.code for status in EXIT_STATUSES if status.kubernetes is action)
                       for action in (PodAction.IGNORE, PodAction.FAIL_JOB)}


def test_the_help_and_the_docs_show_the_table():
    from tfstrategy.cli.launch import DESCRIPTION
    from tfstrategy.contract.exits import EXIT_STATUSES, PodAction, help_table, markdown_table

    assert help_table() in DESCRIPTION
    guide = (ROOT / "docs" / "guides" / "multi-worker.md").read_text(encoding="utf-8")
    assert markdown_table() in guide, "docs/guides/multi-worker.md: paste tfstrategy.contract.exits.markdown_table()"
    clusters = (ROOT / "docs" / "guides" / "clusters.md").read_text(encoding="utf-8")
    rows = dict((int(code), action) for code, action in re.findall(r"^\| exit (\d+) \| `(\w+)` \|", clusters, re.M))
    assert rows == {status.code: status.kubernetes.value for status in EXIT_STATUSES
                    if status.kubernetes is not PodAction.COUNT}


def test_the_worker_writes_the_starting_file_the_launcher_reads(tmp_path):
    from tfstrategy.contract.files import starting_file, worker_files
    from tfstrategy.multiworker.worker_protocol import signal_joined, signal_starting
    from tfstrategy.settings import ENV_JOIN_FILE, ENV_NUM_WORKERS, ENV_WORKER_INDEX

    files = worker_files(tmp_path, 1)
    environ = {ENV_WORKER_INDEX: "1", ENV_NUM_WORKERS: "2", ENV_JOIN_FILE: str(files.join_file)}
    assert signal_starting(environ) and starting_file(files.join_file).exists()
    assert signal_joined(environ) and files.join_file.exists()
    assert {path.name for path in tmp_path.iterdir()} == {"worker-1.joined", "worker-1.joined.starting"}
