"""Many replicas: the cluster spec (nodes, GPUs, links) and the replicas placed on it (DESIGN.md)."""
from .spec import Cluster, Replica

__all__ = ["Cluster", "Replica"]
