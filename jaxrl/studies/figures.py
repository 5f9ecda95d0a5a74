"""Matplotlib set-up shared by the studies' figures (the Agg backend: files only, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def new_figure(width: float, height: float) -> tuple[Any, Any]:
    """(figure, axes) on the Agg backend; matplotlib is imported only when a figure is drawn."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt.subplots(figsize=(width, height))


def save(fig: Any, ax: Any, path: str | Path, xlabel: str | None, ylabel: str) -> None:
    """Label the axes, add the legend, write the PNG and free the figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
