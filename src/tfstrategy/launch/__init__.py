"""``tfstrategy launch``: the supervisor of worker groups on one or several machines, and network isolation."""
