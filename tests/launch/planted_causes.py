"""Issue 38's planted causes: the headline each gets on the launcher's console (one place for both kinds of test).

``test_planted`` searches node 0's real console for them (``tests/workers/planted_worker.py`` on real
TensorFlow workers); ``test_nnodes_diagnosis`` searches the headline node 0 says when each node's
worker views come from a fake node over the real wire and the real across-nodes diagnosis.
"""

from __future__ import annotations

#: The headline each cause gets (a regular expression searched in the launcher's report), and its exit status.
HEADLINES = {
    "uneven": (r"worker 1 (plans 7 batch\(es\) in epoch 1 while worker 0 plans 8|ran out of data after 7 batch\(es\) "
               r"of epoch 1 while worker 0 waits in batch 8): the shards differ by one batch", None),
    "different-step": (r"workers 0 and 1 traced different train functions \(step 1\)", None),
    "different-model": (r"workers 0 and 1 built different models: weight 1 is dense/kernel \(4, 8\) on worker 0 and "
                        r"dense/kernel \(4, 16\) on worker 1", None),
    "exit0": (r"worker 1 exited 0 before joining: the job cannot form", 1),
    "exit1": (r"worker 1 exited (with status )?1 before joining", 1),
    "slow-input": (r"warning: worker 1 is a straggler: it waits [0-9.]+ s a step for its input, [0-9.]+x its peers'", 0),
    "slow-step": (r"warning: worker 1 is a straggler: its steps take [0-9.]+x its peers' CPU", 0),
    # A py_function in dataset.map: TensorFlow runs it in Python (the stack cannot tell a map's from a step's).
    "slow-map": (r"warning: worker 1 is a straggler: it spends [0-9.]+ s a step in a tf.py_function/numpy_function "
                 r"\(decode at planted_worker.py:\d+\), [0-9.]+x its peers'", 0),
}
#: What precedes a headline on node 0's console (a stall's, another node's).
PREFIX = r"tfstrategy launch: (stall: )?(node \d:? )?"
#: What follows a straggler's warning (its evidence lines between): the warning never stops the job.
GOES_ON = r".*\n(  .*\n)*  the job goes on"
