"""A loader's figures in Prometheus' text format, on a local HTTP endpoint
(``ferry.Loader(..., metrics="127.0.0.1:9464")``).

Nothing is counted here: a collector reads the loader's stats() and a
profile snapshot when the endpoint is scraped, on the server's thread, so
the batches never pay for it. Names follow Prometheus' conventions: the
unit in the name, ``_total`` on counters, times as histograms in seconds
(the profile's buckets at each power of two). Needs prometheus_client
(Debian: python3-prometheus-client).
"""

import threading
import time
import weakref
from wsgiref.simple_server import WSGIRequestHandler, make_server

try:
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)
    from prometheus_client.exposition import ThreadingWSGIServer
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("ferry.Loader(metrics=...) needs prometheus_client (Debian: "
                      "python3-prometheus-client; pip: prometheus-client): %s" % e) from e

from . import _ferry

COUNTERS = {  # stats() key: (metric, help)
    "dispatched": ("ferry_tasks_dispatched", "tasks sent to workers"),
    "completed": ("ferry_batches_completed", "batches (or failures) received from workers"),
    "delivered": ("ferry_batches_delivered", "batches handed to the trainer"),
    "failed": ("ferry_batches_failed", "batches the dataset failed on"),
    "malformed": ("ferry_messages_malformed", "messages dropped as malformed"),
    "restarts": ("ferry_worker_restarts", "workers replaced after dying or timing out"),
    "retirements": ("ferry_worker_retirements", "workers replaced on purpose"),
    "timeouts": ("ferry_batch_timeouts", "batches that ran past timeout_ms"),
    "lost": ("ferry_remote_workers_lost", "remote workers given up"),
}
GAUGES = {
    "workers": ("ferry_workers", "workers alive and ready"),
    "in_flight": ("ferry_batches_in_flight", "batches dispatched, not yet delivered"),
    "prefetch": ("ferry_prefetch_batches", "the window: the most batches in flight now"),
    "slot_memory": ("ferry_slot_memory_bytes", "bytes of shared-memory batch slots"),
}
STAGE_HELP = ("seconds of each delivered batch by stage: make (the worker's build), transit "
              "(queued at the worker and transfers), order (held back behind an earlier "
              "batch), held (waiting for the trainer), wait (the trainer's wait in next()), "
              "step (the trainer's step)")


def _buckets(hist):
    count, total, bounds = hist
    return [("%g" % le, n) for le, n in bounds] + [("+Inf", count)], total


class _Collector:
    def __init__(self, loader):
        self._loader = weakref.ref(loader)

    def collect(self):
        loader = self._loader()
        c = loader._c if loader is not None else None
        if c is None:
            return
        st = c.stats()
        snap = c.profile()
        for key, (name, doc) in COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=st[key])
        for key, (name, doc) in GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=st[key])
        stages = HistogramMetricFamily("ferry_stage_seconds", STAGE_HELP, labels=["stage"])
        for k, stage in enumerate(_ferry.STAGES):
            buckets, total = _buckets(snap.histogram(k))
            stages.add_metric([stage], buckets, sum_value=total)
        yield stages
        make = HistogramMetricFamily("ferry_worker_make_seconds",
                                     "seconds each worker took to make a batch",
                                     labels=["worker"])
        transit = CounterMetricFamily("ferry_worker_transit_seconds",
                                      "seconds each worker's batches spent queued and in "
                                      "transit", labels=["worker"])
        rep = snap.report()
        for index in sorted(rep["workers"]):
            buckets, total = _buckets(snap.histogram(0, index))
            make.add_metric([str(index)], buckets, sum_value=total)
            transit.add_metric([str(index)], rep["workers"][index]["stages"]["transit"]["total"])
        yield make
        yield transit
        verdict = GaugeMetricFamily("ferry_verdict", "1 for the loader's verdict since open",
                                    labels=["kind"])
        verdict.add_metric([rep["kind"]], 1)
        yield verdict
        yield GaugeMetricFamily("ferry_trainer_wait_ratio",
                                "share of the trainer's time spent waiting in next() since open",
                                value=rep["wait_share"])


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Server:
    """The endpoint: a threaded HTTP server on its own daemon thread.

    ``scrapes`` and ``cpu_seconds`` say what rendering the figures has
    cost the trainer's process: the CPU time of the application call in
    each request's own thread (time.thread_time), which holds the GIL as
    long. Reading the request, writing the response and the thread's
    start are not in it."""

    def __init__(self, loader, host, port):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(loader))
        app = make_wsgi_app(registry)
        self.scrapes, self.cpu_seconds = 0, 0.0
        counted = threading.Lock()  # requests have a thread each

        def timed(environ, start_response):
            t0 = time.thread_time()
            try:
                return app(environ, start_response)
            finally:
                spent = time.thread_time() - t0
                with counted:
                    self.cpu_seconds += spent
                    self.scrapes += 1

        self._httpd = make_server(host, port, timed, ThreadingWSGIServer, handler_class=_Quiet)
        self.address = "%s:%d" % self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ferry-metrics",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def serve(loader, where):
    """Starts the endpoint at ``where``: "HOST:PORT" or a port (on
    127.0.0.1); port 0 picks a free one (Loader.metrics_address says
    which)."""
    if isinstance(where, int):
        host, port = "127.0.0.1", where
    else:
        host, _, port = str(where).rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            port = int(port)
        except ValueError:
            raise ValueError("ferry.Loader: metrics must be \"HOST:PORT\", got %r" % (where,))
    try:
        return Server(loader, host, port)
    except OSError as e:
        raise OSError(e.errno, "ferry.Loader: cannot serve metrics at %s:%d: %s"
                      % (host, port, e.strerror)) from e
