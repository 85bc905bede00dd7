"""Loop tfstrategy's auto-K path (build, tune at the first ``fit``, train) until it crashes or the rounds run out.

The companion of ``upstream_iterator_crash.py``, which reproduces the TensorFlow crash with TensorFlow
and Keras alone. This one runs the body of ``test_build_in_scope_auto_tunes_at_the_first_fit``:
``build_in_scope(..., steps_per_execution="auto")`` under a one-device ``MirroredStrategy``, then
``fit`` on arrays (8 steps), round after round. ``--without-workaround`` turns off the skipped build
peek (``tfstrategy.training.no_trace.skip_build_peek``), which is how the crash showed in the test suite.

Run both sides at once, so each loads the machine for the other::

    .venv/bin/python benchmarks/auto_k_crash_loop.py --rounds 600 &
    .venv/bin/python benchmarks/auto_k_crash_loop.py --rounds 600 --without-workaround

It exits 0 if every round passed. A crash kills it with SIGSEGV (shell status 139); the last
``round N`` line printed says how far it got.
"""

from __future__ import annotations

from upstream_iterator_crash import checked_rounds, regression_data, rounds_argument, run_rounds, small_model


def main() -> None:
    parser = rounds_argument(__doc__.splitlines()[0], default=600)
    parser.add_argument("--without-workaround", action="store_true",
                        help="leave Keras' build peek in place after tuning (the landed code before the workaround)")
    args = parser.parse_args()
    rounds = checked_rounds(parser, args)

    from tfstrategy.selection.cpu_split import configure_cpu_replicas

    configure_cpu_replicas(4)  # the test suite's set-up; the strategy uses the first of the 4
    import keras
    import tensorflow as tf

    import tfstrategy
    from tfstrategy.training import steps_per_execution

    if args.without_workaround:
        steps_per_execution.skip_build_peek = lambda model: None
    x, y = regression_data()

    def one_round() -> None:
        model, _ = tfstrategy.build_in_scope(tf.distribute.MirroredStrategy(["/cpu:0"]), lambda: small_model(keras),
                                             optimizer="sgd", loss="mse", steps_per_execution="auto")
        model.fit(x, y, batch_size=128, epochs=1, verbose=0)

    run_rounds(rounds, one_round)


if __name__ == "__main__":
    main()
