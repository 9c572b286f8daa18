"""Figures of the course (see plotting/__init__.py)."""

__all__: list[str] = []
