"""The worker-launcher contract: what a worker and whatever started it (``launch``, ``k8s``) both know.

Both sides import it, and it imports nothing of tfstrategy back but :mod:`tfstrategy.errors` and
:mod:`tfstrategy.settings` (``tests/test_contract.py`` holds that), nor TensorFlow:

- :mod:`~tfstrategy.contract.exits`: every exit status, one table (:data:`~tfstrategy.contract.exits.EXIT_STATUSES`);
- :mod:`~tfstrategy.contract.files`: the names of the files a worker shares with its launcher;
- :mod:`~tfstrategy.contract.reports`, :mod:`~tfstrategy.contract.ledger`: the formats of those files
  (error, progress, ledger), both sides of each;
- :mod:`~tfstrategy.contract.bounds`: what a ledger's field carries between nodes, declared on the field,
  from which the views' converters and the rendezvous' checks derive;
- :mod:`~tfstrategy.contract.pod`: the variables a generated Kubernetes Job gives each pod.

The ``TFSTRATEGY_*`` variables of a launched worker are :mod:`tfstrategy.worker_contract`'s.
"""
