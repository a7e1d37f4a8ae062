"""Where a loader's time goes, for Python: Loader.profile() and the opt-in
exports (a Prometheus endpoint, a trace file of batches, the live view's
socket for ``python -m ferry.top``).

The figures are the C library's (ferry_loader_profile: each delivered
batch's make, transit, order and held stages, the trainer's wait in next()
and its step, per worker), as is the verdict; this module only names the
windows of time and starts and stops the exports. Nothing here runs per
batch: the endpoint reads a snapshot when it is scraped, the trace is kept
by the C loader and written at close, the live view reads one a second
while someone watches (_live).
"""

import numbers
import weakref

TRACE_BATCHES = 20000  # the last batches a trace keeps: about 10 MB of JSON


def take_options(options):
    """Pops the export options (metrics, trace, trace_batches, live) out of
    a Loader's keyword options and returns them as a dict."""
    out = {k: options.pop(k) for k in ("metrics", "trace", "trace_batches", "live")
           if k in options}
    from . import _live
    out["live"] = _live.wanted(out.get("live"))  # checked before anything starts
    metrics = out.get("metrics")
    if metrics is not None and not isinstance(metrics, (str, int)):
        raise TypeError("ferry.Loader: metrics must be \"HOST:PORT\" or a port, not %s"
                        % type(metrics).__name__)
    n = out.get("trace_batches", TRACE_BATCHES)
    if not isinstance(n, numbers.Integral) or not 0 < n < 2**32:
        raise ValueError("ferry.Loader: trace_batches must be an int > 0, got %r" % (n,))
    return out


def report(loader, since):
    """The dict Loader.profile() returns (see its docstring)."""
    c = loader._live()
    snap = c.profile()
    if since == "last":
        mark = loader.__dict__.get("_profile_mark")
        loader._profile_mark = (c, snap)
        window = snap.since(mark[1]) if mark and mark[0] is c else snap
    elif since == "open":
        window = snap
    else:
        raise ValueError("profile(): since must be \"last\" or \"open\", not %r" % (since,))
    rep = window.report()
    for index, w in rep["workers"].items():
        host = None
        try:
            pid = c.worker_pid(index)
        except Exception:  # a remote worker's slot
            pid = 0
        if not pid:  # a remote worker: its host, and its pid there
            try:
                name, rpid = c.worker_host(index)
                host = "%s:%d" % (name, rpid) if name else None
            except Exception:
                pass
        w["pid"] = pid or None
        w["host"] = host
    return rep


def format_report(rep):
    """The report as lines of text: the verdict, then a table of stages."""
    lines = [rep["verdict"], "",
             "%d batches in %.2f s; per batch (ms):" % (rep["batches"], rep["seconds"]),
             "  %-8s %9s %9s %9s %9s" % ("stage", "mean", "p50", "p90", "p99")]
    for name, s in rep["stages"].items():
        lines.append("  %-8s %9.3f %9.3f %9.3f %9.3f" % (name, s["mean"] * 1e3, s["p50"] * 1e3,
                                                     s["p90"] * 1e3, s["p99"] * 1e3))
    if rep["workers"]:
        lines.append("  %-8s %9s %9s %9s %9s" % ("worker", "batches", "busy", "make p50",
                                                 "transit"))
        for i, w in sorted(rep["workers"].items()):
            st = w["stages"]
            lines.append("  %-8s %9d %8.0f%% %9.3f %9.3f" % (
                i, w["batches"], w["busy"] * 100, st["make"]["p50"] * 1e3,
                st["transit"]["mean"] * 1e3))
    return "\n".join(lines)


class Exports:
    """A loader's opt-in exports: ``metrics`` ("HOST:PORT" or a port on
    127.0.0.1) serves Prometheus' text format from a thread of its own;
    ``trace`` (a path) keeps the last ``trace_batches`` batches and writes
    them at close as Chrome trace-event JSON; ``live`` shows the loader
    to ``python -m ferry.top`` (_live)."""

    def __init__(self, loader, metrics=None, trace=None, trace_batches=TRACE_BATCHES,
                 live=False):
        self._server = None
        self._trace = None
        self._live = None
        if trace is not None:
            loader._live().trace(int(trace_batches))
            self._trace = str(trace)
        if metrics is not None:
            from . import _metrics
            self._server = _metrics.serve(loader, metrics)
        if live:
            from . import _live
            if _live.attach(loader):
                self._live = weakref.ref(loader)

    @property
    def metrics_address(self):
        return self._server.address if self._server else None

    @property
    def live(self):
        return self._live is not None

    def close(self, c):
        """Leaves the live view, stops the endpoint and writes the trace (c:
        the C loader, still open)."""
        if self._live is not None:
            from . import _live
            loader, self._live = self._live(), None
            _live.detach(loader)
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._trace is not None and c is not None:
            path, self._trace = self._trace, None
            c.trace_write(path)
