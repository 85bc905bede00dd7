"""The rules of ARCHITECTURE.md that import-linter cannot say (its contracts, in pyproject.toml, hold the layers).

Read from the source (``ast``), no TensorFlow: `make lint` runs this module beside ``lint-imports``.

- Private TensorFlow/Keras modules (``keras.src``, ``tensorflow.python``, ``tf_keras.src``) are imported,
  loaded or spelled in code only in ``_compat/``: a new release then breaks one package.
- An attribute of an object tfstrategy does not own is written only through ``state/`` (a ``Replacement``,
  ``RUNTIME.override_attribute``) or a ``_compat`` accessor, so ``reset()`` can undo it: no bare
  ``setattr``/``object.__setattr__``/``delattr`` elsewhere. The writes below predate the rule; each says
  why it stays, and the list may only shrink (an entry that no longer matches fails too).
- A Keras workaround is installed only through ``patches.apply_patches`` (every one, or those named), so
  wherever it is installed from it counts as the plan's ``apply_patches`` step: no ``PATCH.apply()`` elsewhere.
- ``_protocols`` (the TensorFlow/Keras objects as typing protocols) is imported only under ``TYPE_CHECKING``:
  types cost a worker nothing at run time.
- Every ``TFSTRATEGY_*`` variable is declared once, as a ``settings.Variable`` (a cluster environment's in its
  module): its name is spelled as a string in that declaration and nowhere else in the code, and every name
  the code's messages, the docs or the CLI's help mention is a declared one.
- And it is read and written only through that declaration (``.text``, ``.read``, ``.to_environ``): no code
  indexes an environment with a variable's name (its string, an ``ENV_*`` constant or ``X.name``), so no
  reader skips its parser and no writer its format.
- Every field of the ledger is declared once, in ``contract/ledger.py`` (with what of it crosses the wire):
  a module that reads or writes a ledger reaches its fields by attribute or derives them from the declaration
  (``contract/bounds.py``), never by a name spelled as a string.
"""

from __future__ import annotations

import ast
import re

import pytest

from helpers import ROOT

PACKAGE = ROOT / "src" / "tfstrategy"
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tf_keras.src")
#: Where writing another object's attribute is the point: the undoable replacements, the accessors.
WRITERS = ("state/", "_compat/")
#: (module, the written object) -> why it is not yet a registered replacement.
KNOWN_WRITES = {
    ("multiworker/chief_files.py", "writer"): "keep_per_worker's public mark on a callback the script passes",
    ("patches/keras_mwms.py", "model"): "drops Keras' cached train/test function so Keras rebuilds it patched",
    ("patches/keras_chief_files.py", "callback"): "a patched callback's paths, put back by the same patch",
    ("patches/keras_chief_files.py", "self"): "the patched callback's private copy, inside the patch's own method",
    ("patches/keras_loss_scale_api.py", "get_scaled_loss"): "a mark on tfstrategy's own function",
    ("patches/keras_loss_scale_api.py", "get_unscaled_gradients"): "a mark on tfstrategy's own function",
    ("patches/keras_steps_per_execution.py", "function"): "a mark on tfstrategy's own function",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py"))]


def _docstrings(tree: ast.Module) -> set[int]:
    nodes: list[ast.AST] = [tree, *(node for node in ast.walk(tree)
                                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    found = set()
    for node in nodes:
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def _private_uses(tree: ast.Module) -> list[str]:
    """Each place ``tree`` imports, loads or spells a private upstream module (docstrings may name one)."""
    def private(name: str) -> bool:
        return any(name == prefix or name.startswith(prefix + ".") for prefix in PRIVATE_MODULES)

    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names if private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and private(node.module):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if any(prefix + "." in node.value or node.value == prefix for prefix in PRIVATE_MODULES):
                found.append(f"line {node.lineno}: {node.value[:80]!r}")
        elif isinstance(node, ast.Attribute) and ast.unparse(node) in PRIVATE_MODULES:  # once per chain
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _attribute_writes(tree: ast.Module) -> list[tuple[str, int]]:
    """``(written object, line)`` of each ``setattr``/``delattr``/``object.__setattr__``/``object.__delattr__``."""
    writes = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = ast.unparse(node.func)
        if name in ("setattr", "delattr", "object.__setattr__", "object.__delattr__"):
            writes.append((ast.unparse(node.args[0]), node.lineno))
    return writes


def test_private_upstream_modules_are_named_only_in_compat():
    offenders = {path: uses for path, tree in _modules()
                 if not path.startswith("_compat/") and (uses := _private_uses(tree))}
    assert not offenders, (
        f"private TensorFlow/Keras modules outside _compat/: {offenders}. Add an accessor to "
        "tfstrategy/_compat (with @accessor naming the upstream path) and call it instead."
    )


def test_no_bare_attribute_write_on_objects_tfstrategy_does_not_own():
    seen = set()
    new = []
    for path, tree in _modules():
        if path.startswith(WRITERS):
            continue
        for target, line in _attribute_writes(tree):
            seen.add((path, target))
            if (path, target) not in KNOWN_WRITES:
                new.append(f"{path}:{line} writes {target}")
    assert not new, (
        f"bare attribute writes: {new}. Replace upstream code with a Patch/Rewrite (state.Replacement), an "
        "instance's attribute with RUNTIME.override_attribute(...), so reset() undoes it."
    )
    stale = set(KNOWN_WRITES) - seen
    assert not stale, f"no longer written, strike from KNOWN_WRITES: {sorted(stale)}"


def _patch_applications(tree: ast.Module) -> list[int]:
    """The lines of ``PATCH.apply()`` or ``module.PATCH.apply()`` calls."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "apply"
            and ast.unparse(node.func.value).split(".")[-1] == "PATCH"]


def test_a_patch_is_applied_only_through_apply_patches():
    offenders = {path: lines for path, tree in _modules()
                 if path != "patches/__init__.py" and (lines := _patch_applications(tree))}
    assert not offenders, (
        f"patches applied directly: {offenders}. Call tfstrategy.patches.apply_patches(PATCH.name), so the plan's "
        "apply_patches step counts the fix (tfstrategy env, the exit summary) wherever it was installed from."
    )


def _runtime_imports_of(tree: ast.Module, module: str) -> list[int]:
    """The lines where ``tree`` imports ``module`` outside an ``if TYPE_CHECKING:`` block."""
    guarded = {id(node) for block in ast.walk(tree)
               if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
               for statement in block.body for node in ast.walk(statement)}
    return [node.lineno for node in ast.walk(tree) if id(node) not in guarded and (
        (isinstance(node, ast.ImportFrom) and node.module == module)
        or (isinstance(node, ast.Import) and any(alias.name == module for alias in node.names)))]


def test_protocols_are_imported_only_for_type_checking():
    offenders = {path: lines for path, tree in _modules() if (lines := _runtime_imports_of(tree, "tfstrategy._protocols"))}
    assert not offenders, f"tfstrategy._protocols imported at run time: {offenders}. Import it under `if TYPE_CHECKING:`."


@pytest.mark.parametrize("source, expected", [
    pytest.param("from keras.src.utils import file_utils", 1, id="from-import"),
    pytest.param("import tensorflow.python.eager.context", 1, id="import"),
    pytest.param("name = 'keras.src.saving.saving_lib'", 1, id="spelled-path"),
    pytest.param("x = tf.python.framework", 0, id="tf-alias-not-a-module-name"),
    pytest.param("x = tensorflow.python.framework.ops", 1, id="attribute-chain"),
    pytest.param('"""Reads keras.src.utils.file_utils.makedirs."""', 0, id="docstring"),
    pytest.param("import keras", 0, id="public"),
])
def test_the_private_module_reader(source, expected):
    assert len(_private_uses(ast.parse(source))) == expected


#: Modules that spell a variable's name themselves, and why (the test checks it is a declared one).
NAMES_SPELLED_OUTSIDE = {
    "runtime/startup/sitecustomize.py": "runs in every Python process started with the hook's PYTHONPATH: it "
                                        "imports tfstrategy only when TFSTRATEGY_HOOK says so",
    "launch/reaper.py": "run as a file, it imports nothing of tfstrategy so it starts in milliseconds",
}
_NAME = re.compile(r"TFSTRATEGY_[A-Z0-9_]*[A-Z0-9]\b(?!_?\*)")


def _declared() -> dict[str, object]:
    from tfstrategy.contract.pod import K8S_VARIABLES
    from tfstrategy.environments.slurm import SLURM_VARIABLES
    from tfstrategy.multiworker.coordinated import FAULT
    from tfstrategy.settings import VARIABLES

    variables = (*VARIABLES, *SLURM_VARIABLES, *K8S_VARIABLES, FAULT)
    names = [variable.name for variable in variables]
    assert len(names) == len(set(names)), f"declared twice: {sorted(n for n in names if names.count(n) > 1)}"
    return {variable.name: variable for variable in variables}


def _declarations(tree: ast.Module) -> set[int]:
    """The ``name=`` constants of ``Variable(...)`` calls in ``tree``."""
    return {id(keyword.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Variable" for keyword in node.keywords if keyword.arg == "name"}


def test_every_variable_name_is_spelled_once_in_its_declaration():
    declared = _declared()
    spelled: dict[str, list[str]] = {}
    outside = []
    for module, tree in _modules():
        declarations = _declarations(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.fullmatch(node.value)):
                continue
            where = f"{module}:{node.lineno}"
            if id(node) in declarations:
                spelled.setdefault(node.value, []).append(where)
            elif module in NAMES_SPELLED_OUTSIDE:
                assert node.value in declared, f"{where} spells {node.value!r}, which no Variable declares"
            else:
                outside.append(f"{where} {node.value}")
    assert not outside, (f"variable names spelled outside their declaration: {outside}; use the Variable "
                         "(settings.X.name, .text(env), .read(env)) instead")
    assert {name: places for name, places in spelled.items() if len(places) > 1} == {}
    assert sorted(spelled) == sorted(declared)


def test_every_variable_the_code_or_the_docs_mention_is_declared():
    declared = _declared()
    texts = [*(path for path in PACKAGE.rglob("*.py")), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md",
             ROOT / "ARCHITECTURE.md"]
    unknown = sorted({f"{path.relative_to(ROOT)}: {name}" for path in texts
                      for name in _NAME.findall(path.read_text(encoding="utf-8")) if name not in declared})
    assert not unknown, f"TFSTRATEGY_* names no Variable declares (a typo, or one removed): {unknown}"


def test_each_variable_says_who_reads_it_what_it_means_and_what_a_valid_value_is():
    from tfstrategy.settings import Side

    for name, variable in _declared().items():
        assert isinstance(variable.side, Side) and variable.help.strip() and variable.expected.strip(), name


#: Where a ledger field's name is spelled on purpose: its declaration.
LEDGER_DECLARATION = "contract/ledger.py"
#: (module, word) -> what the word names there, in a module that handles ledgers, other than a ledger's field.
OTHER_WORDS = {
    ("launch/elastic.py", "time"): "a re-formation record's wall-clock time (reformations.jsonl)",
    ("launch/elastic.py", "step"): "a re-formation record's newest committed step",
    ("launch/ledger_diagnosis.py", "steps"): "WorkerView.steps on the wire: the progress file's count, beside the ledger",
    ("launch/rendezvous/checks.py", "steps"): "the check of WorkerView.steps",
    ("launch/rendezvous/checks.py", "time"): "the check of Failed.time, a message's field",
    ("launch/stragglers.py", "py_function"): "the name of a measure the straggler watch compares",
}


def _ledger_fields() -> set[str]:
    import dataclasses

    from tfstrategy.contract.ledger import FunctionTrace, Ledger

    return {field.name for record in (Ledger, FunctionTrace) for field in dataclasses.fields(record)}


def _handles_ledgers(tree: ast.Module) -> bool:
    """Whether ``tree`` imports the ledger (anywhere: a function's import or a ``TYPE_CHECKING`` one too)."""
    modules = ("tfstrategy.contract.ledger", "tfstrategy.launch.ledger")
    return any((isinstance(node, ast.ImportFrom) and node.module in modules)
               or (isinstance(node, ast.Import) and any(alias.name in modules for alias in node.names))
               for node in ast.walk(tree))


def test_each_ledger_field_is_spelled_as_a_string_only_in_its_declaration():
    """A ledger field spelled as a key (``record["py_function_seconds"]``) is a second place to edit when a field is
    added; the wire's converters and checks derive from the declaration instead. Only the modules that import the
    ledger are read: elsewhere ``epoch``, ``steps`` or ``time`` are other records' words (Keras' params, a backup's
    sidecar, the performance report)."""
    fields = _ledger_fields()
    seen = set()
    spelled = []
    for path, tree in _modules():
        if path == LEDGER_DECLARATION or not _handles_ledgers(tree):
            continue
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in fields and id(node) not in docstrings:
                seen.add((path, node.value))
                if (path, node.value) not in OTHER_WORDS:
                    spelled.append(f"{path}:{node.lineno} {node.value!r}")
    assert not spelled, (
        f"ledger fields spelled as strings outside {LEDGER_DECLARATION}: {spelled}. Read the field by attribute, or "
        "derive from its declaration (tfstrategy.contract.bounds: to_wire, from_wire, bounds); if the word names "
        "something else there, add it to OTHER_WORDS saying what."
    )
    stale = set(OTHER_WORDS) - seen
    assert not stale, f"no longer spelled, strike from OTHER_WORDS: {sorted(stale)}"


#: Where an environment is indexed by a variable's name by design: the declarations themselves, and the cluster
#: environments, which read their own variables (and the launcher's) with their own errors.
DECLARING_MODULES = ("settings.py", "environments/", "contract/pod.py")
_ENVIRONMENTS = ("os.environ", "environ", "env", "self.environ")


def _names_a_variable(node: ast.AST) -> bool:
    """``"TFSTRATEGY_..."``, an ``ENV_*`` constant or a declaration's ``X.name``."""
    return ((isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_NAME.fullmatch(node.value)))
            or (isinstance(node, ast.Name) and node.id.startswith("ENV_"))
            or (isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Name)
                and node.value.id.isupper()))


def _environ_by_name(tree: ast.Module) -> list[str]:
    """Each place ``tree`` reads or writes an environment by a variable's name: ``environ[X]`` (but ``del``),
    ``environ.get(X)``/``setdefault(X)``, ``X in environ`` and a dict keyed by ``X``. Removing one
    (``pop``, ``del``) parses and writes nothing, so it may name the variable."""
    found = []
    for node in ast.walk(tree):
        keys: list[ast.AST] = []
        if (isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Del)
                and ast.unparse(node.value) in _ENVIRONMENTS):
            keys = [node.slice]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "setdefault") and ast.unparse(node.func.value) in _ENVIRONMENTS):
            keys = [node.args[0]]
        elif isinstance(node, ast.Compare) and any(ast.unparse(item) in _ENVIRONMENTS for item in node.comparators):
            keys = [node.left]
        elif isinstance(node, ast.Dict):
            keys = [key for key in node.keys if key is not None]
        found += [f"line {node.lineno}: {ast.unparse(node)[:80]}" for key in keys if _names_a_variable(key)]
    return found


def test_variables_are_read_and_written_only_through_their_declaration():
    offenders = {path: uses for path, tree in _modules()
                 if not path.startswith(DECLARING_MODULES) and path not in NAMES_SPELLED_OUTSIDE
                 and (uses := _environ_by_name(tree))}
    assert not offenders, (
        f"an environment indexed by a variable's name: {offenders}. Read it with its Variable (settings.X.text(env), "
        ".read(env): its parser and its error) and write it with X.to_environ(value) (or WorkerSettings.to_environ)."
    )


@pytest.mark.parametrize("source, expected", [
    pytest.param("os.environ[ENV_ISOLATED] = '1'", 1, id="write-by-constant"),
    pytest.param("x = os.environ.get(BACKUP_DIR.name)", 1, id="get-by-declaration-name"),
    pytest.param("x = env['TFSTRATEGY_PORT_RANGE']", 1, id="mapping-by-string"),
    pytest.param("x = ENV_NODE_RANK in environ", 1, id="membership"),
    pytest.param("env.update({ENV_PRECISION: 'float32'})", 1, id="dict-written-by-hand"),
    pytest.param("x = BACKUP_DIR.text(os.environ)", 0, id="through-the-variable"),
    pytest.param("os.environ.update(ISOLATED.to_environ(True))", 0, id="written-by-the-variable"),
    pytest.param("env.pop(HOOK_PID.name, None)", 0, id="removal"),
    pytest.param("x = os.environ.get('TF_CONFIG')", 0, id="not-a-tfstrategy-variable"),
    pytest.param("x = environ[spec.name]", 0, id="a-declaration-in-a-loop"),
])
def test_the_environment_reader(source, expected):
    assert len(_environ_by_name(ast.parse(source))) == expected
