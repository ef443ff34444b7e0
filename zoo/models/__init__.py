"""Model definitions and the registry that builds them by name."""

from zoo.models import (
    db,  # noqa: F401
    ppyoloe,  # noqa: F401
    resnet,  # noqa: F401  (imported so its models register)
)
from zoo.models.registry import (
    UnknownModelError,
    create_model,
    list_models,
    register_model,
)

__all__ = [
    "register_model",
    "list_models",
    "create_model",
    "UnknownModelError",
]
