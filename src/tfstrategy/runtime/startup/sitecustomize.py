"""Start-up hook of the processes ``tfstrategy run`` and ``tfstrategy launch`` start.

Python imports the first ``sitecustomize`` module on ``sys.path`` at start-up.
tfstrategy puts this directory first on ``PYTHONPATH`` for the processes it
starts, so this runs in each of them (``python script.py``, ``python -m pkg``
or a console script) before the user's code. It installs tfstrategy's worker
hook (:mod:`tfstrategy.runtime.worker_hook`) only when ``TFSTRATEGY_HOOK=1``,
then runs the ``sitecustomize`` the environment already had, if any.
"""

import os
import sys


def _run_the_users_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("TFSTRATEGY_HOOK") == "1":
    try:
        from tfstrategy.runtime import worker_hook

        worker_hook.install()
    except Exception as error:  # the user's program must start even if tfstrategy cannot hook it
        print(f"tfstrategy: the worker hook was not installed ({type(error).__name__}: {error})", file=sys.stderr)
_run_the_users_sitecustomize()
