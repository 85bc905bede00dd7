"""Everything that runs inside a training process: the start-up hook, its steps and its rewrites."""
