"""``plot``: a picture of this session's trace, written beside it (nndb.render)."""
from __future__ import annotations

from ..errors import CommandError, NndbError
from ..render.plotdata import WHATS
from ..schema import KIND_WORDS, STAT_NAMES
from .table import Command, PictureFile

PLOT_WORDS = WHATS + tuple(w for w in KIND_WORDS if w != "loss")


def _plot_arg(text: str):
    words = text.split()
    what = words.pop(0) if words and words[0] in WHATS else "heatmap"
    kind = KIND_WORDS[words.pop(0)] if words and words[0] in KIND_WORDS else None
    glob = stat = None
    if words and what == "heatmap" and len(words) == 1 and words[0] in STAT_NAMES:
        stat = words.pop(0)
    if words:
        glob = words.pop(0)
    if words:
        stat = words.pop(0)
        if stat not in STAT_NAMES:
            raise CommandError(f"unknown statistic '{stat}' (one of: {', '.join(STAT_NAMES)})")
    if words:
        raise CommandError(f"unexpected '{' '.join(words)}'")
    if what == "history" and not glob:
        raise CommandError("plot history needs a tensor's name")
    return what, kind, glob, stat or "norm"


def _plot(s, arg):
    what, kind, glob, stat = arg
    from ..extras import require
    from ..render.pictures import picture
    if not s.log.trace_path:
        raise CommandError("no trace yet: nothing has been recorded")
    try:
        require("plot", "plot")
        with s.view.trace_reader() as reader:
            path = picture(reader, what, kind, stat, glob, list(s.log.findings), list(s.log.stops))
    except NndbError as e:
        raise CommandError(str(e)) from None
    return PictureFile(path)


COMMANDS = [
    Command("plot", "plot [heatmap|loss|history|ratio] [KIND] [GLOB] [STAT]",
            """Draw a picture of the trace into a PNG beside it and print its path.
  plot grad conv*          heat map of the gradients' norm per layer and step (log colours)
  plot act * zero_frac     heat map of another kind and statistic
  plot loss                the loss curve, with the findings and stops marked
  plot history fc1.weight  one tensor's statistics over the steps (KIND: default weight)
  plot ratio [GLOB]        update/weight ratio per layer, against the 1e-3 band
Needs matplotlib (pip install 'nndb[plot]').""",
            _plot, _plot_arg, args=("sub:" + "|".join(PLOT_WORDS), "tensor", "stat"), group="data"),
]
