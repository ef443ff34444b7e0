"""ampzoo: a PaddlePaddle model zoo."""

from zoo.models import create_model, list_models, register_model

__version__ = "0.1.0"

__all__ = ["create_model", "list_models", "register_model", "__version__"]
