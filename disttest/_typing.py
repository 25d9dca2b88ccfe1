"""Type variables that disttest's modules share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__unittest = True

#: A decorated function: a decorator typed ``(F) -> F`` keeps its signature.
F = TypeVar("F", bound=Callable[..., Any])
