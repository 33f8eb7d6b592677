"""Many replicas: the cluster spec (nodes, GPUs, links), placement rules, fast SP, and the cluster engine."""
from .engine import POLICIES, ClusterEngine, ClusterResult, simulate_cluster
from .spec import Cluster, Replica

__all__ = ["POLICIES", "Cluster", "ClusterEngine", "ClusterResult", "Replica", "simulate_cluster"]
