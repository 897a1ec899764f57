"""The workloads the cost model projects and validates: published model sizes and speeds."""
from __future__ import annotations

IMAGENET_TRAIN = 1_281_167
RESNET50_GMAC, RESNET18_GMAC = 4.09, 1.81
PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032}
METHOD_OF = {"allreduce": ("allreduce", "pull"), "easgd": ("easgd", "pull"), "asgd": ("asgd", "pull"),
             "asgd lr/p": ("asgd", "pull"),
             "gossip-pull": ("gossip", "pull"), "gossip-push": ("gossip", "push")}
