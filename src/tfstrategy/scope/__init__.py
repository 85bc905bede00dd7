"""The strategy's scope: auditing where variables were created, building in scope, restoring checkpoints."""
