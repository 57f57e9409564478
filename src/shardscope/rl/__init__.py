"""RL post-training weight sync: predict the time to move a trained policy's weights from the trainer's
layout to the rollout engines' layout (`shardscope rl-sync`)."""

from shardscope.rl.layout import RolloutLayout, TrainLayout, parse_rollout, parse_train
from shardscope.rl.sync import MECHANISMS, SyncEstimate, SyncPart, predict_sync

__all__ = [
    "MECHANISMS",
    "RolloutLayout",
    "SyncEstimate",
    "SyncPart",
    "TrainLayout",
    "parse_rollout",
    "parse_train",
    "predict_sync",
]
