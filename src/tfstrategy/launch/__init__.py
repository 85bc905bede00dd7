"""``tfstrategy launch``: the supervisor of local worker groups, and network isolation."""
