"""ipywidgets explorers of the course: each returns a widget to display, its figure updating live.

Modules by topic: attention (attention and mask explorers, chapters 01-03), normalization
(chapter 04), encoding (chapter 08).
"""

from transformer_lab.widgets.attention import *  # noqa: F403
from transformer_lab.widgets.encoding import *  # noqa: F403
from transformer_lab.widgets.normalization import *  # noqa: F403
