"""Model specs: HF config.json → ModelSpec with exact parameter counts."""

from shardscope.models.catalog import list_models, load_model
from shardscope.models.hf import model_from_hf_config
from shardscope.models.spec import ModelSpec

__all__ = ["ModelSpec", "list_models", "load_model", "model_from_hf_config"]
