"""Training for pruning: network-slimming sparsity on BatchNorm gammas, a classification loop, torch.distributed.

>>> from prunefx.train import TrainConfig, fit, evaluate
>>> fit(model, data.train, TrainConfig(epochs=10), val=data.val, checkpoint=Path("last.pt"))
"""

from prunefx.train.bn_recalibration import Recalibration, recalibrate_bn
from prunefx.train.distill import DistillConfig
from prunefx.train.distributed import DistContext, DistributedError, init_from_env, spawn
from prunefx.train.loop import FitResult, Metrics, TrainConfig, TrainError, evaluate, fit
from prunefx.train.recover import RecoverConfig, RecoverError, RecoverResult, recover
from prunefx.train.sparsity import (
    BNSparsity,
    Schedule,
    SparsityConfig,
    TargetSparsity,
    fraction_below,
    residual_bns,
    sparsity_stats,
)
from prunefx.train.user_code import UserCodeError

__all__ = ["BNSparsity", "DistContext", "DistillConfig", "DistributedError", "FitResult", "Metrics", "Recalibration",
           "RecoverConfig", "RecoverError", "RecoverResult", "Schedule", "SparsityConfig", "TargetSparsity",
           "TrainConfig", "TrainError", "UserCodeError", "evaluate", "fit", "fraction_below", "init_from_env",
           "recalibrate_bn", "recover", "residual_bns", "sparsity_stats", "spawn"]
