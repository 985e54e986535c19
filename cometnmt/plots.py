"""Plots shared by the CLI and the trainer (matplotlib, drawn off-screen)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` drawing off-screen (the Agg backend: no display needed), imported
    only when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``path``, whole or not at all (:func:`~cometnmt.atomic.atomic_write`): a
    report's figure cut short by a kill or a full disk was kept, half drawn, beside the report a
    later call that finished nothing keeps as it was."""
    from cometnmt.atomic import atomic_write

    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)


def whole_epochs(*axes) -> None:
    """Ticks at whole epochs only on each axis's x axis: left to matplotlib, the epoch axis of
    one-epoch runs read 0.96, 0.98, 1.00, 1.02, 1.04, and of two-epoch runs 1.0, 1.2, ... 2.0."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # one epoch: the tick 1 alone


def plot_attention(amap, path: Path, title: str) -> None:
    """One pair's attention as a heatmap PNG: source tokens across, target tokens down."""
    plt = pyplot()

    cols, rows = len(amap.source), len(amap.target)
    fig, ax = plt.subplots(figsize=(min(2 + 0.45 * cols, 30), min(1.5 + 0.4 * rows, 30)))
    image = ax.imshow(amap.weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), amap.source, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(rows), amap.target, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04).set_label("attention weight")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
