"""Loader.profile(): the stages add up to what the test measures, the
verdict is right in each case built on purpose, and the exports (a
Prometheus endpoint, a trace file) read back with real parsers.

Times come from sleeps inside the datasets and the trainer's loop: a
known cost per batch and a known step, not a wait for anything."""

import json
import time
import urllib.request

import pytest

import ferry
from profile_datasets import EveryKthBatchSlow, SlowInOneWorker


def run(loader, batches, step_s, warm=8):
    """Takes `warm` batches, marks the profile, then `batches` more with a
    step of `step_s` each; returns the profile since the mark and the
    batches' (flight + ready) summed, and the wall time of the loop."""
    it = loader.stream()
    for _ in range(warm):
        next(it)
    loader.profile()  # the mark: the window starts here
    latency = 0.0
    t0 = time.monotonic()
    for _ in range(batches):
        b = next(it)
        latency += b.flight_time + b.ready_time
        del b
        time.sleep(step_s)  # the trainer's step
    wall = time.monotonic() - t0
    return loader.profile(), latency, wall


def test_stages_of_each_batch_add_up_to_its_measured_latency():
    with ferry.Loader("synthetic:n=4096,dim=8,sleep_us=3000", batch_size=8, workers=2) as ld:
        p, latency, wall = run(ld, 80, 0.002)
    st = p["stages"]
    assert p["batches"] == 80
    four = sum(st[s]["total"] for s in ("make", "transit", "order", "held"))
    assert four == pytest.approx(latency, rel=0.05)
    # The trainer's wait and step: the loop's wall time, less the last
    # step (counted with the next call, which never came).
    trainer = st["wait"]["total"] + st["step"]["total"]
    assert trainer == pytest.approx(wall - st["step"]["mean"], rel=0.05)
    assert st["make"]["mean"] == pytest.approx(0.003, rel=0.3)
    assert st["step"]["p50"] == pytest.approx(0.002, rel=0.3)
    assert sorted(p["workers"]) == [0, 1]
    assert sum(w["batches"] for w in p["workers"].values()) == 80
    assert all(w["pid"] for w in p["workers"].values())


def test_verdict_trainer_bound_when_the_step_is_the_slow_part():
    with ferry.Loader("synthetic:n=4096,dim=8,sleep_us=500", batch_size=8, workers=2) as ld:
        p, _, _ = run(ld, 50, 0.006)
    assert p["kind"] == "trainer-bound", p["verdict"]
    assert "not the problem" in p["verdict"]


def test_verdict_input_bound_suggests_the_workers_that_cover_the_step():
    # 8 ms a batch, a 2 ms step: 4 workers make one per step.
    with ferry.Loader("synthetic:n=8192,dim=8,sleep_us=8000", batch_size=8, workers=2) as ld:
        p, _, _ = run(ld, 100, 0.002)
    assert p["kind"] == "input-bound", p["verdict"]
    assert 3 <= p["workers_needed"] <= 5, p["verdict"]
    assert "about %d workers" % p["workers_needed"] in p["verdict"]


def test_verdict_names_the_one_slow_worker_among_four():
    ds = SlowInOneWorker(n=4096, slow=2, fast_ms=0.5, slow_ms=5)
    with ferry.Loader(ds, batch_size=4, workers=4) as ld:
        p, _, _ = run(ld, 120, 0.001)
    assert p["kind"] == "slow-worker", p["verdict"]
    assert p["slow_worker"] == 2
    assert "worker 2" in p["verdict"]


def test_verdict_order_bound_when_batches_wait_behind_a_late_one():
    ds = EveryKthBatchSlow(n=4096, batch_size=4, k=5, fast_ms=0.25, slow_ms=40)
    with ferry.Loader(ds, batch_size=4, workers=4, prefetch=12) as ld:
        p, _, _ = run(ld, 100, 0.001)
    assert p["kind"] == "order-bound", p["verdict"]
    assert "in_order=False" in p["verdict"]
    assert p["stages"]["order"]["total"] > p["stages"]["wait"]["total"]


def test_profile_windows_and_since_open_differ():
    with ferry.Loader("synthetic:n=4096,dim=8", batch_size=8, workers=1,
                      worker_mode="thread") as ld:
        it = ld.stream()
        for _ in range(10):
            next(it)
        assert ld.profile()["batches"] == 10
        for _ in range(5):
            next(it)
        assert ld.profile()["batches"] == 5
        assert ld.profile(since="open")["batches"] == 15
        with pytest.raises(ValueError):
            ld.profile(since="yesterday")


def test_metrics_endpoint_parses_as_prometheus_text():
    parser = pytest.importorskip("prometheus_client.parser")
    with ferry.Loader("synthetic:n=4096,dim=8,sleep_us=500", batch_size=8, workers=2,
                      metrics="127.0.0.1:0") as ld:
        run(ld, 20, 0.0005)
        with urllib.request.urlopen("http://%s/metrics" % ld.metrics_address,
                                    timeout=10) as r:
            text = r.read().decode()
        server = ld._exports._server
        assert server.scrapes == 1  # the endpoint counts what serving cost
        assert 0 < server.cpu_seconds < 5
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["ferry_batches_delivered"].type == "counter"
    delivered = [s.value for s in families["ferry_batches_delivered"].samples
                 if s.name == "ferry_batches_delivered_total"]
    assert delivered == [28]
    stages = families["ferry_stage_seconds"]
    assert stages.type == "histogram"
    assert {s.labels["stage"] for s in stages.samples} == set(ferry._ferry.STAGES)
    counts = [s.value for s in stages.samples
              if s.name == "ferry_stage_seconds_count" and s.labels["stage"] == "make"]
    assert counts == [28]
    inf = [s.value for s in stages.samples if s.name == "ferry_stage_seconds_bucket"
           and s.labels["stage"] == "make" and s.labels["le"] == "+Inf"]
    assert inf == [28]
    workers = {s.labels["worker"] for s in families["ferry_worker_make_seconds"].samples}
    assert workers == {"0", "1"}
    assert ld.metrics_address is None  # closed: the endpoint is gone


def test_trace_is_trace_event_json_with_a_track_per_worker(tmp_path):
    path = tmp_path / "trace.json"
    with ferry.Loader("synthetic:n=4096,dim=8,sleep_us=500", batch_size=8, workers=3,
                      trace=str(path), trace_batches=40) as ld:
        run(ld, 60, 0.0005)
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {1: "trainer", 2: "worker 0", 3: "worker 1", 4: "worker 2"}
    makes = [e for e in events if e["ph"] == "X" and e["cat"] == "worker"]
    assert len(makes) == 40  # bounded: the last 40 batches
    assert {e["tid"] for e in makes} == {2, 3, 4}
    assert all(e["dur"] >= 400 for e in makes)  # microseconds: 0.5 ms sleeps
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "wait"]
    assert len(waits) == 40


def test_exports_bench_runs_both_sides_and_scrapes_the_endpoint():
    pytest.importorskip("prometheus_client")
    from ferry import bench_exports
    a = bench_exports.parse_args(["--batches", "300", "--rounds", "1", "--batch-size", "8"])
    res = bench_exports.bench(a)
    (r,) = res["rounds"]
    assert r["off"]["scrapes"] is None and r["off"]["trace_bytes"] is None
    assert r["on"]["scrapes"] >= 1  # the endpoint answered the scraper
    assert r["on"]["trace_bytes"] > 300 * 100  # a trace of every batch was written
    assert res["ratio"]["median"] == pytest.approx(
        r["on"]["batches_per_s"] / r["off"]["batches_per_s"])
    # the server counted what it rendered during the timed batches: the
    # scraper's first scrape came before them
    assert 0 <= r["on"]["serving"]["scrapes"] <= r["on"]["scrapes"]
    assert r["on"]["serving"]["cpu_seconds"] >= 0
    # (whole clock ticks: a run this short may count none)
    assert r["off"]["cpu_us_per_batch"] >= 0 and r["on"]["cpu_us_per_batch"] >= 0
    text = bench_exports.table(res)
    assert "on/off" in text and "serving a scrape" in text
    # the whole exchange's cost: every scrape answered (urlopen raises else)
    costs = bench_exports.exchange_cost(a, scrapes=20, repeats=2)
    assert len(costs) == 2 and all(c >= 0 for c in costs)
