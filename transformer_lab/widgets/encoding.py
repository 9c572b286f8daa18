"""An explorer of the sinusoidal positional encoding (chapter 08).

    explorer = tl.widgets.encoding_explorer(d_model=64, max_len=100)
    explorer            # in a notebook: three sliders and a figure that follows them

It works without a notebook too: change a slider's `.value` and `explorer.state` and
`explorer.figure` follow at once (the tests do exactly that).
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from transformer_lab.embedding import sinusoidal_encoding
from transformer_lab.plotting.encoding import encoding_overview
from transformer_lab.plotting.style import course_style

__all__ = ["EncodingExplorer", "encoding_explorer"]


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class EncodingExplorer:
    """Three sliders (position, dimension, d_model) and a three-panel figure of the encoding.

    Attributes:
        position, dimension, d_model: the `ipywidgets.IntSlider`s.
        figure: the matplotlib Figure, redrawn in place on every change.
        pe: the current (max_len, d_model) table.
        state: the current choice, {"position", "dimension", "d_model"}; `n_draws` counts redraws.
        widget: the ipywidgets box to display.
    """

    def __init__(self, d_model: int = 64, max_len: int = 100, position: int = 10, dimension: int = 4) -> None:
        for name, value in (("d_model", d_model), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an int >= 2, got {value!r}")
        if d_model > 512:
            raise ValueError(f"d_model must be at most 512 for the explorer, got {d_model}")
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < max_len:
            raise ValueError(f"position must be an int in [0, {max_len}), got {position!r}")
        if isinstance(dimension, bool) or not isinstance(dimension, int) or not 0 <= dimension < d_model:
            raise ValueError(f"dimension must be an int in [0, {d_model}), got {dimension!r}")
        self.max_len = max_len
        self.n_draws = 0
        style = {"description_width": "80px"}
        self.position = widgets.IntSlider(
            value=position, min=0, max=max_len - 1, description="position", style=style, continuous_update=False
        )
        self.dimension = widgets.IntSlider(
            value=dimension, min=0, max=d_model - 1, description="dimension", style=style, continuous_update=False
        )
        self.d_model = widgets.IntSlider(
            value=d_model, min=2, max=512, description="d_model", style=style, continuous_update=False
        )
        with course_style():
            self.figure = Figure(figsize=(12.0, 3.4), layout="constrained")  # not registered with pyplot
        self.output = widgets.Output()
        self.widget = widgets.VBox([widgets.HBox([self.position, self.dimension, self.d_model]), self.output])
        self.pe = sinusoidal_encoding(max_len, d_model)
        self.position.observe(self._on_change, names="value")
        self.dimension.observe(self._on_change, names="value")
        self.d_model.observe(self._on_d_model, names="value")
        self.redraw()

    @property
    def state(self) -> dict[str, int]:
        return {"position": self.position.value, "dimension": self.dimension.value, "d_model": self.d_model.value}

    def _on_d_model(self, change: dict) -> None:
        new = change["new"]
        self.pe = sinusoidal_encoding(self.max_len, new)
        if self.dimension.value > new - 1:
            # lowering max clamps the value, which fires _on_change with the old table size: hold redraws off
            self.dimension.unobserve(self._on_change, names="value")
            self.dimension.max = new - 1
            self.dimension.observe(self._on_change, names="value")
        else:
            self.dimension.max = new - 1
        self.redraw()

    def _on_change(self, change: dict) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Draw the figure for the current sliders (and show it, inside a notebook)."""
        encoding_overview(self.pe, self.position.value, self.dimension.value, fig=self.figure)
        self.n_draws += 1
        if _in_kernel():
            # Replace the Output widget's content in one state update. Not `with self.output: display(...)`:
            # that routes through iopub messages, which a headless runner (nbval) files under the cell itself.
            from IPython import get_ipython

            data, metadata = get_ipython().display_formatter.format(self.figure)
            self.output.outputs = ({"output_type": "display_data", "data": data, "metadata": metadata},)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:
        s = self.state
        return f"EncodingExplorer(position={s['position']}, dimension={s['dimension']}, d_model={s['d_model']})"


def encoding_explorer(
    d_model: int = 64, max_len: int = 100, position: int = 10, dimension: int = 4
) -> EncodingExplorer:
    """Build the chapter 08 explorer of the sinusoidal encoding (display it as the last line of a cell).

    Args:
        d_model: starting D (the slider goes from 2 to 512; odd values work, the last column is a sine).
        max_len: the number of positions drawn.
        position, dimension: the starting row and column.

    Returns:
        An `EncodingExplorer`: `.widget` to display, `.state` and `.figure` to inspect.
    """
    return EncodingExplorer(d_model=d_model, max_len=max_len, position=position, dimension=dimension)
