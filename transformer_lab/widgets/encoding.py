"""Widgets of the course (see widgets/__init__.py)."""

__all__: list[str] = []
