"""Where a job's step time goes: the performance report (``tfstrategy run/launch --profile``, or a callback).

- :mod:`tfstrategy.performance.verdict`: the shares, the bottleneck, the recommendations, the text and JSON (pure).
- :mod:`tfstrategy.performance.report`: timing the steps, the probes, the Keras callback, custom loops.
"""
