"""Batching for replicas, input pipelines, and custom training loops."""
