"""Chart data for matplotlib figures, in the shape E2B's code-interpreter SDK reads
(`e2b_code_interpreter.charts`): run once in each Python kernel of stockade's code interpreter,
inside the sandbox.

It registers an IPython display formatter for `application/vnd.stockade.chart+json`, so every
figure the kernel shows (the inline backend's, `display(fig)`, a figure as the last value)
carries its data beside its PNG, and the server hands it on as the result's `chart`. One axes
gives a line, scatter, bar, pie or box-and-whisker chart; a figure of several gives a
`superchart` of them. An axes it cannot read (mixed kinds, images, 3-D) gives no chart, and
the PNG is still there. A figure of more than MAX_POINTS values gives none either, so the data
stays within the server's output bound; the extraction never raises into the user's cell.

Box plots are read from the statistics matplotlib drew them from (`Axes.bxp`'s input, recorded
when `matplotlib.axes` is first imported), not guessed from their lines.

Written for stockade; it shares no code with E2B's `e2b-charts`.
"""


def _stockade_charts():
    import importlib.abc
    import math
    import re
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    mime = "application/vnd.stockade.chart+json"
    max_points = 100_000
    unit_re = re.compile(r"[(\[]([^()\[\]]+)[)\]]\s*$")

    def record_boxes(module):
        original = module.Axes.bxp

        def bxp(self, bxpstats, *args, **kwargs):
            drawn = original(self, bxpstats, *args, **kwargs)
            self.__dict__.setdefault("_stockade_boxes", []).append(list(bxpstats))
            return drawn

        module.Axes.bxp = bxp

    def chart_method(module):
        # A method, not a type printer: matplotlib's inline backend removes every formatter's
        # printer for Figure when it is switched on (in the user's first cell that plots).
        module.Figure._repr_stockade_chart_ = figure_chart

    patches = {"matplotlib.axes._axes": record_boxes, "matplotlib.figure": chart_method}

    class AfterImport(importlib.abc.MetaPathFinder):
        """Patches a matplotlib module once it is imported (so a kernel that never plots never
        imports matplotlib)."""

        def find_spec(self, name, path, target=None):
            patch = patches.pop(name, None)
            if patch is None:
                return None
            if not patches:
                sys.meta_path.remove(self)
            from importlib.util import find_spec

            spec = find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                try:
                    patch(module)
                except Exception:  # noqa: BLE001 (a chart is a convenience, never an error)
                    pass

            spec.loader.exec_module = exec_module
            return spec

    def num(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return f if math.isfinite(f) else None

    def tick(v):
        return float(f"{v:.12g}") if isinstance(v, float) else v

    def kind_of(axis):
        converter = getattr(axis, "converter", None)
        name = type(converter).__module__ if converter is not None else ""
        if "dates" in name:
            return "datetime"
        if "category" in name:
            return "categorical"
        return axis.get_scale()

    def coord(axis, kind, v):
        if kind == "datetime":
            from matplotlib.dates import num2date

            return num2date(v).isoformat()
        if kind == "categorical":
            names = {i: k for k, i in getattr(axis.units, "_mapping", {}).items()}
            return names.get(int(round(float(v))), num(v))
        return num(v)

    def label_of(artist):
        text = artist.get_label() or ""
        return "" if text.startswith("_") else text

    def axis_part(ax, which):
        axis = getattr(ax, f"{which}axis")
        kind = kind_of(axis)
        text = axis.get_label().get_text()
        unit = unit_re.search(text)
        ticks = list(axis.get_majorticklocs())
        return axis, kind, {
            f"{which}_label": text or None,
            f"{which}_unit": unit.group(1).strip() if unit else None,
            f"{which}_scale": kind,
            f"{which}_ticks": [tick(coord(axis, kind, t)) for t in ticks],
            f"{which}_tick_labels": list(axis.major.formatter.format_ticks(ticks)),
        }

    def points(ax, xs, ys):
        xaxis, xk, _ = axis_part(ax, "x")
        yaxis, yk, _ = axis_part(ax, "y")
        return [[coord(xaxis, xk, x), coord(yaxis, yk, y)] for x, y in zip(xs, ys)]

    def point_chart(ax, kind, series):
        chart = {"type": kind, "title": ax.get_title() or None, "elements": []}
        for which in ("x", "y"):
            chart.update(axis_part(ax, which)[2])
        for artist, xs, ys in series:
            chart["elements"].append({"label": label_of(artist), "points": points(ax, xs, ys)})
        return chart

    def plain_2d(ax, kind, elements):
        chart = {"type": kind, "title": ax.get_title() or None, "elements": elements}
        for which in ("x", "y"):
            part = axis_part(ax, which)[2]
            chart[f"{which}_label"], chart[f"{which}_unit"] = part[f"{which}_label"], part[f"{which}_unit"]
        return chart

    def bars(ax, containers):
        elements = []
        for c in containers:
            horizontal = getattr(c, "orientation", None) == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            kind = kind_of(axis)
            for rect in c.patches:
                if horizontal:
                    at, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
                else:
                    at, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
                elements.append({"label": label_of(c), "group": str(coord(axis, kind, at)), "value": num(value)})
        return plain_2d(ax, "bar", elements)

    def boxes(ax, recorded):
        elements = []
        for stats in recorded:
            for i, s in enumerate(stats):
                elements.append({
                    "label": str(s.get("label", i + 1)),
                    "min": num(s["whislo"]), "first_quartile": num(s["q1"]), "median": num(s["med"]),
                    "third_quartile": num(s["q3"]), "max": num(s["whishi"]),
                    "outliers": [num(v) for v in s.get("fliers", [])],
                })
        return plain_2d(ax, "box_and_whisker", elements)

    def axes_chart(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.container import BarContainer
        from matplotlib.patches import Wedge

        recorded = ax.__dict__.get("_stockade_boxes")
        if recorded:
            return boxes(ax, recorded)
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata(orig=False))]
        scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
        containers = [c for c in ax.containers if isinstance(c, BarContainer)]
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges and len(wedges) == len(ax.patches) and not lines and not scatters:
            elements = [{"label": label_of(w), "angle": num(w.theta2 - w.theta1), "radius": num(w.r)} for w in wedges]
            return {"type": "pie", "title": ax.get_title() or None, "elements": elements}
        if containers and not lines and not scatters:
            return bars(ax, containers)
        if lines and not scatters and not ax.patches:
            return point_chart(ax, "line", [(ln, ln.get_xdata(orig=False), ln.get_ydata(orig=False)) for ln in lines])
        if scatters and not lines and not ax.patches:
            series = [(c, c.get_offsets()[:, 0], c.get_offsets()[:, 1]) for c in scatters]
            return point_chart(ax, "scatter", series)
        return None

    def size(chart):
        total = 0
        for e in chart.get("elements", []):
            total += len(e.get("points", ())) + len(e.get("outliers", ())) + 1
            if isinstance(e, dict) and "elements" in e:
                total += size(e)
        return total

    def raw_points(fig):
        total = 0
        for ax in fig.get_axes():
            total += sum(len(ln.get_xdata(orig=False)) for ln in ax.get_lines())
            total += sum(len(c.get_offsets()) for c in ax.collections) + len(ax.patches)
        return total

    def figure_chart(fig):
        try:
            from matplotlib.axes import Axes

            if raw_points(fig) > max_points:
                return None
            axes = [ax for ax in fig.get_axes() if isinstance(ax, Axes) and ax.name == "rectilinear" and ax.get_visible()]
            charts = [c for c in (axes_chart(ax) for ax in axes) if c is not None]
            if not charts:
                return None
            if len(charts) == 1:
                chart = charts[0]
            else:
                title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
                chart = {"type": "superchart", "title": title, "elements": charts}
            return chart if size(chart) <= max_points else None
        except Exception:  # noqa: BLE001 (a chart is a convenience, never an error)
            return None

    class ChartFormatter(BaseFormatter):
        format_type = Unicode(mime)
        print_method = ObjectName("_repr_stockade_chart_")
        _return_type = dict

    shell = get_ipython()
    if shell is None:
        return
    shell.display_formatter.formatters[mime] = ChartFormatter(parent=shell.display_formatter)
    # The kernel's display formatter formats only the types active when it was made.
    if mime not in shell.display_formatter.active_types:
        shell.display_formatter.active_types = [*shell.display_formatter.active_types, mime]
    for name in [n for n in patches if n in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, AfterImport())


_stockade_charts()
del _stockade_charts
