"""Multi-worker jobs: TF_CONFIG, saving from every worker, and the worker side of ``tfstrategy launch``."""
