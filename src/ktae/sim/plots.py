"""Learning curves per axis, like the TACO paper's Fig. 4 (needs matplotlib).

One figure per axis, one panel per value of the axis; in each panel one line per method
(mean over seeds) with a band of ± one standard deviation over seeds. The legend sits
right of the panels so that it never covers a curve; broadcast (solid black) and the
step-level oracle (dashed black) are drawn thick and underneath, so that a method that
coincides with one of them stays visible on top of it.
"""

from __future__ import annotations

from pathlib import Path

from ktae.sim.config import AXES, AXIS_LABELS
from ktae.sim.report import BROADCAST, ORACLE
from ktae.sim.run import SimResult

FILE_NAMES = {axis: f"curves_{AXIS_LABELS[axis]}.png" for axis in AXES}


def _styles(methods) -> dict[str, dict]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    dashes = ("-", "-.", ":")
    styles, k = {}, 0
    for m in methods:
        if m == BROADCAST:
            styles[m] = {"color": "black", "linestyle": "-", "linewidth": 2.4, "zorder": 2}
        elif m == ORACLE:
            styles[m] = {"color": "black", "linestyle": "--", "linewidth": 2.4, "zorder": 2}
        else:
            styles[m] = {"color": cmap(k % cmap.N), "linestyle": dashes[k // cmap.N % 3],
                         "linewidth": 1.3, "zorder": 3}
            k += 1
    return styles


def plot_axis(result: SimResult, axis: str, path: Path, *, dpi: int = 100) -> Path:
    """Write the figure of one axis to ``path`` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cfg = result.config
    settings = cfg.axis_settings(axis)
    methods = cfg.method_names
    styles = _styles(methods)
    steps = np.asarray(result.eval_steps)
    ncol = 1 if len(methods) <= 14 else 2
    legend_width = (0.6 + 0.075 * max(len(m) for m in methods)) * ncol
    width = 3.4 * len(settings) + 0.6 + legend_width
    fig, axes = plt.subplots(1, len(settings), figsize=(width, 3.4), sharey=True,
                             squeeze=False)
    for ax, s in zip(axes[0], settings, strict=True):
        for m in methods:
            c = result.curves[(m, s)].numpy()
            mean = c.mean(0)
            std = c.std(0, ddof=1) if c.shape[0] > 1 else np.zeros_like(mean)
            ax.plot(steps, mean, label=m, **styles[m])
            ax.fill_between(steps, mean - std, mean + std, color=styles[m]["color"],
                            alpha=0.10, linewidth=0, zorder=1)
        ax.set_title(f"{AXIS_LABELS[axis]} = {getattr(s, axis)}")
        ax.set_xlabel("update step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("expected normalised return")
    fixed = ", ".join(f"{AXIS_LABELS[a]} = {getattr(cfg.base, a)}" for a in AXES if a != axis)
    fig.suptitle(f"{AXIS_LABELS[axis]} axis ({fixed}; |A| = {cfg.actions}, lr = {cfg.lr:g}, "
                 f"mean ± std over {cfg.seeds} seeds)", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - legend_width / width, 1))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def plot_all(result: SimResult, out_dir: Path, *, dpi: int = 100) -> list[Path]:
    """One PNG per axis in ``out_dir``: ``curves_H.png``, ``curves_n_opt.png``,
    ``curves_G.png``."""
    return [plot_axis(result, axis, Path(out_dir) / FILE_NAMES[axis], dpi=dpi)
            for axis in AXES]
