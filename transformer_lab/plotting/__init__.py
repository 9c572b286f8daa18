"""Every figure of the course, one function per kind of picture, in one style.

A notebook cell that draws is one line: `tl.plotting.attention_heatmap(weights, tokens, tokens)`.
Modules by topic: style (shared look and primitives), attention (attention maps, masks),
normalization (chapter 04), encoding (chapter 08), model (chapter 09: schedules, training curves), gpt (chapter 10),
modern (chapter 11), tokens (chapter 12).
"""

from transformer_lab.plotting.attention import *  # noqa: F403
from transformer_lab.plotting.encoding import *  # noqa: F403
from transformer_lab.plotting.gpt import *  # noqa: F403
from transformer_lab.plotting.model import *  # noqa: F403
from transformer_lab.plotting.modern import *  # noqa: F403
from transformer_lab.plotting.normalization import *  # noqa: F403
from transformer_lab.plotting.style import *  # noqa: F403
from transformer_lab.plotting.tokens import *  # noqa: F403
