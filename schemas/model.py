"""The base of toolfleet's pydantic models: bad values raise a toolfleet error.

A model given values it cannot hold raises :class:`~toolfleet.schemas.errors.ModelValidationError`,
which is pydantic's ``ValidationError`` (same text, same ``errors()``, caught by
``except ValidationError``) and a :class:`~toolfleet.schemas.errors.ToolfleetError`, so no
pydantic error escapes toolfleet's API outside the root of its errors.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ValidationError

from toolfleet.schemas.errors import ModelValidationError

__all__ = ["ToolfleetModel", "as_toolfleet_error"]


def as_toolfleet_error(exc: ValidationError) -> ValidationError:
    """``exc`` as a :class:`ModelValidationError` with the same title and errors (``exc``
    itself when it already is one, or when pydantic cannot rebuild it)."""
    if isinstance(exc, ModelValidationError):
        return exc
    try:
        return ModelValidationError.from_exception_data(
            exc.title,
            exc.errors(include_url=False),  # type: ignore[arg-type]
        )
    except Exception:  # an error type pydantic cannot rebuild: the original stands
        return exc


class ToolfleetModel(BaseModel):
    """A pydantic model whose validation errors are toolfleet errors."""

    # Both call pydantic's validator directly, as BaseModel's own methods do: results and
    # records are built 100,000 at a time, and one more Python frame each would show.

    def __init__(self, /, **data: Any) -> None:
        try:
            self.__pydantic_validator__.validate_python(data, self_instance=self)
        except ValidationError as exc:
            raise as_toolfleet_error(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            if args or kwargs:  # strict=, context=, ...: pydantic checks and passes them
                return super().model_validate(obj, *args, **kwargs)
            validated: Self = cls.__pydantic_validator__.validate_python(obj)
            return validated
        except ValidationError as exc:
            raise as_toolfleet_error(exc) from None

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(*args, **kwargs)
        except ValidationError as exc:
            raise as_toolfleet_error(exc) from None
