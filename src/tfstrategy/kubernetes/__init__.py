"""Kubernetes without an operator: the manifests of ``tfstrategy k8s`` (an Indexed Job, its Service, a NetworkPolicy)."""

from tfstrategy.kubernetes.manifests import K8sOptions, manifests, validate_k8s_options
from tfstrategy.kubernetes.yaml_text import dump_all

__all__ = ["K8sOptions", "manifests", "validate_k8s_options", "dump_all"]
