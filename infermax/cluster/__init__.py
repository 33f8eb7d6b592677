"""Many replicas: the cluster spec (nodes, GPUs, links), placement rules, fast SP, gangs, the cluster
engine and its policies, the cluster schedule and its judge."""
from .engine import POLICIES, ClusterEngine, ClusterResult, simulate_cluster
from .judge import ClusterScheduleError, replay_cluster
from .load import at_load, capacity_rps
from .policies import ClusterPolicy, get_policy
from .schedule import ClusterSchedule
from .spec import Cluster, Replica

__all__ = ["POLICIES", "Cluster", "ClusterEngine", "ClusterPolicy", "ClusterResult", "ClusterSchedule",
           "ClusterScheduleError", "Replica", "at_load", "capacity_rps", "get_policy", "replay_cluster",
           "simulate_cluster"]
