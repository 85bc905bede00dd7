"""Where a job's step time goes: the performance report (``tfstrategy run/launch --profile``, or a callback).

- :mod:`tfstrategy.performance.verdict`: the shares, the bottleneck, the recommendations, the text and JSON (pure).
- :mod:`tfstrategy.performance.report`: when a report is due, the Keras callback, custom loops.
- :mod:`tfstrategy.performance.timing`: timing the job's steps and the probes' calls.
- :mod:`tfstrategy.performance.probes`: the probes, which leave no trace (:mod:`tfstrategy.training.no_trace`).
- :mod:`tfstrategy.performance.environment`: the ``--profile`` variables (light: no probe, no TensorFlow).
"""
