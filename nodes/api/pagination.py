"""Paged lists: every list the API answers is one page, ``{"items": [...], "count": N}``.

Django Ninja's limit/offset pagination with Rankwise's bounds: ``limit`` 1–1,000 (default 200,
what a list gave before it was paged), ``offset`` from 0; ``count`` is every row the filters
match, so a client reads on while ``offset + len(items) < count``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, get_type_hints

from django.db.models import Model, QuerySet
from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination, paginate

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000
MAX_OFFSET = 2**31  # beyond any table here; bounded so the database never sees a huge number

M = TypeVar("M", bound=Model)


class Page(LimitOffsetPagination):
    """Limit/offset pages of at most ``MAX_LIMIT`` items."""

    class Input(Schema):
        limit: int = Field(
            DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Items per page (at most 1,000)."
        )
        offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Items to skip.")

    class Output(Schema):
        items: list[Any]
        count: int = Field(..., description="Every item the filters match, on all pages.")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_limit=MAX_LIMIT, **kwargs)


def paged(view: Callable[..., Any]) -> Callable[..., Any]:
    """``ninja.pagination.paginate(Page)`` for a view of a module with postponed annotations:
    Ninja reads a wrapped view's annotations in its own module, so they are resolved here,
    where the view was written, first."""
    view.__annotations__ = get_type_hints(view, include_extras=True)
    wrapped: Callable[..., Any] = paginate(Page)(view)
    return wrapped


class Rows(Generic[M]):
    """A queryset whose page is turned into JSON documents by ``shape`` only once it is cut:
    what a paged view returns when its items are built from rows (one query per page)."""

    def __init__(self, rows: QuerySet[M], shape: Callable[[M], dict[str, Any]]) -> None:
        self.rows, self.shape = rows, shape

    def __getitem__(self, part: slice) -> list[dict[str, Any]]:
        return [self.shape(row) for row in self.rows[part]]

    def __len__(self) -> int:
        return self.rows.count()
