"""Pictures of a validation's per-class results (the report's CLASSES record): the
confusion matrix up to 100 classes, the most confused pairs beyond. scripts/plot_report.py
draws them into its figure; the trackers (core/trackers/) send them as an image at each
validation. matplotlib is optional (core/optional.py)."""

import numpy as np

from paddle_resnet.core.optional import require

# Annotate the matrix's cells with their counts up to this many classes.
ANNOTATED_CLASSES = 20
SHOWN_PAIRS = 20


def confusion_matrix(axes, result, epoch):
    """The row-normalised matrix (a row: one true class), small ones with their counts."""
    counts = np.array(result["confusion"], dtype=float)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    axes.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    names = result["classes"]
    ticks = range(len(names)) if len(names) <= ANNOTATED_CLASSES * 2 else []
    axes.set_xticks(list(ticks), [names[i] for i in ticks], rotation=60, ha="right")
    axes.set_yticks(list(ticks), [names[i] for i in ticks])
    if len(names) <= ANNOTATED_CLASSES:
        for (true, predicted), count in np.ndenumerate(counts):
            if count:
                color = "white" if shares[true, predicted] > 0.5 else "black"
                axes.text(
                    predicted, true, int(count), ha="center", va="center", fontsize=8, color=color
                )
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(f"confusion matrix, epoch {epoch} (rows sum to 1)")


def confused_pairs(axes, result, epoch):
    """The most confused pairs as bars: readable where a 1,000-class matrix is not."""
    pairs = result["confused"][:SHOWN_PAIRS][::-1]
    axes.barh(range(len(pairs)), [n for _, _, n in pairs])
    axes.set_yticks(range(len(pairs)), [f"{true} -> {predicted}" for true, predicted, _ in pairs])
    axes.set_xlabel("images")
    axes.set_title(f"most confused (true -> predicted), epoch {epoch}")


def confusions(axes, result, epoch):
    draw = confusion_matrix if "confusion" in result else confused_pairs
    draw(axes, result, epoch)


def confusion_picture(result, epoch, size=(8, 7), dpi=80):
    """``confusions`` drawn off-screen, as an RGB image (height x width x 3, uint8): no
    display and no pyplot state, so a training process draws it between its steps."""
    purpose = "the trackers' confusion image"
    figure = require("matplotlib.figure", purpose).Figure(figsize=size, dpi=dpi)
    canvas = require("matplotlib.backends.backend_agg", purpose).FigureCanvasAgg(figure)
    confusions(figure.add_subplot(), result, epoch)
    figure.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
