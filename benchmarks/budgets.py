"""How much work each benchmark suite does (:class:`Budget`): the suites take it, and each suite's own
``main()`` makes one, so it stands below every suite (``suites.py`` lists them)."""

from __future__ import annotations

from dataclasses import dataclass

from auto_k import WORKLOADS as AUTO_K_WORKLOADS


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How much work each suite does: ``quick`` for CI, the defaults for the README table."""

    process_repeats: int = 5
    fit_repeats: int = 9
    steps: int = 96
    epochs: int = 1
    #: Suite 4: interleaved rounds of 1- and 2-worker jobs per side (0: only the 2-worker all-reduce jobs).
    mw_rounds: int = 3
    mw_batch: int = 256
    mw_steps: int = 50
    mw_windows: int = 3
    allreduce_bytes: tuple[int, ...] = (1024, 16 * 1024, 128 * 1024, 1024**2, 4 * 1024**2, 16 * 1024**2)
    allreduce_repeats: int = 7
    #: Suites 2 and 3: one process per count of logical CPU replicas.
    replica_counts: tuple[int, ...] = (1, 2, 4)
    #: Suite 5: fresh models tuned by steps_per_execution="auto" per workload and load (the choice's spread).
    auto_k_tunings: int = 5
    #: Suite 5: interleaved rounds of auto (K chosen), K=1 and the seed recipe.
    auto_k_pairs: int = 9
    #: Suite 5: competing busy processes (0 = none) during each pass over the workloads.
    auto_k_loads: tuple[int, ...] = (0, 2)
    #: Suite 5: steps per epoch of the tuned and timed fits (the cap K=1 is timed against is min(this, 64)).
    auto_k_steps: int = 96
    #: (model, logical replicas) timed by suite 5; quick: the 1-replica MLP only (each is a fresh process).
    auto_k_workloads: tuple[tuple[str, int], ...] = AUTO_K_WORKLOADS
    #: Suite 5 (profile_report): workloads x settings run through the CLI with --profile; steps per fit (None: each
    #: workload's default, a few hundred); the cost's interleaved pairs, workloads, steps per timed epoch and timed
    #: callback-hook calls.
    profile_workloads: tuple[str, ...] = ("input", "compute", "reduction")
    profile_settings: tuple[str, ...] = ("1 replica", "4 replicas", "2 workers")
    profile_steps: int | None = None
    profile_pairs: int = 9
    profile_cost_workloads: tuple[str, ...] = ("reduction", "compute")
    profile_cost_steps: int = 20
    profile_hook_calls: int = 5000

    @classmethod
    def quick(cls) -> Budget:
        """Every suite once, on its smallest sizes (for CI: checks they run; the numbers mean nothing).

        One timed sample per side and a few steps per fit; what it costs is its 14 TensorFlow processes: the 3
        commands of ``process``, one per replica count (1, 2) of ``fit``, the 6 workers of ``multi_worker``'s four
        jobs (1 and 2 workers a side), ``auto_k``'s worker and ``profile_report``'s CLI run and cost worker.
        ``auto_k`` runs at load 0: a busy process beside it would burn a core for the whole worker (the busy
        processes of a load are started and stopped by a test of their own, ``tests/test_benchmarks.py``).
        """
        return cls(process_repeats=1, fit_repeats=1, steps=4, epochs=1, mw_rounds=1, mw_steps=2, mw_windows=1,
                   allreduce_bytes=(1024, 16 * 1024), allreduce_repeats=1, replica_counts=(1, 2),
                   auto_k_tunings=1, auto_k_pairs=1, auto_k_loads=(0,), auto_k_steps=4,
                   auto_k_workloads=(("mlp", 1),),
                   profile_workloads=("reduction",), profile_settings=("1 replica",), profile_steps=6,
                   profile_pairs=1, profile_cost_workloads=("reduction",), profile_cost_steps=2,
                   profile_hook_calls=200)
