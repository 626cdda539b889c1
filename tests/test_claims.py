"""Claims and leases (storage/_claims.py) with real processes, real kills and real files."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
from phasesweep.storage import Store
from phasesweep.storage import _claims as claims_module
from phasesweep.storage._claims import Claims, Renewer, create_exclusive
from test_store_s3 import s3_server, s3_store  # noqa: F401  (fixtures)

RUN_IDS = [f"r{i:03d}" for i in range(60)]
CTX = multiprocessing.get_context("fork")


def _racer(root: str, barrier, out) -> None:  # noqa: ANN001
    claims = Claims(Store.open(root), "s")
    barrier.wait()  # all claim at once
    lease, busy = claims.acquire(RUN_IDS, holder=str(os.getpid()))
    out.put((sorted(lease.run_ids), sorted(busy)))
    barrier.wait()  # hold the lease (this process alive) until every racer has claimed


def test_racing_processes_get_disjoint_points_covering_all(tmp_path):
    n = 4
    barrier, out = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_racer, args=(str(tmp_path), barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    got = [set(g) for g, _ in results]
    assert sum(len(g) for g in got) == len(RUN_IDS)  # no point twice ...
    assert set().union(*got) == set(RUN_IDS)  # ... and every point once
    for g, busy in results:
        assert set(busy) == set(RUN_IDS) - set(g)


def _holder(root: str, ready) -> None:  # noqa: ANN001
    lease, _ = Claims(Store.open(root), "s").acquire(RUN_IDS[:5])
    ready.put(sorted(lease.run_ids))
    time.sleep(600)


def test_a_live_holder_blocks_a_killed_one_is_taken_over_at_once(tmp_path):
    store = Store.open(str(tmp_path))
    ready = CTX.Queue()
    proc = CTX.Process(target=_holder, args=(str(tmp_path), ready))
    proc.start()
    try:
        assert ready.get(timeout=120) == RUN_IDS[:5]
        claims = Claims(store, "s", ttl=3600)  # only the process check can free them
        lease, busy = claims.acquire(RUN_IDS[:8])
        assert busy == set(RUN_IDS[:5]) and lease.run_ids == set(RUN_IDS[5:8])
        assert claims.held(RUN_IDS) == set(RUN_IDS[:8])
        lease.release()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert claims.held(RUN_IDS) == set()
        lease, busy = claims.acquire(RUN_IDS[:8])
        assert busy == set() and lease.run_ids == set(RUN_IDS[:8])
        assert lease.owned() == set(RUN_IDS[:8])
        lease.release()
        assert claims.held(RUN_IDS) == set()
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()


def _as_other_host(claims: Claims, lease_id: str) -> None:
    """Rewrite a lease as if its holder ran elsewhere (no process check: expiry only)."""
    path = claims.lease_path(lease_id)
    body = json.loads(claims.store.fs.cat_file(path))
    body.update(host="elsewhere", pid=1)
    claims.store.fs.pipe_file(path, json.dumps(body).encode())


class _Clock:
    """The wall clock the claims read (``time.time``), moved only by the test: whether a
    lease expired depends on the TTL, never on how fast a loaded machine runs the test.
    ``monotonic`` and ``sleep`` (the lock's wait) stay real."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    def __init__(self) -> None:
        self.now = 1.0e9

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(claims_module, "time", fake)
    return fake


def _expiry(claims: Claims, lease_id: str) -> float:
    return json.loads(claims.store.fs.cat_file(claims.lease_path(lease_id)))["expires"]


def test_a_remote_lease_lives_until_its_ttl_and_renewals_extend_it(tmp_path, clock):
    store = Store.open(str(tmp_path))
    claims = Claims(store, "s", ttl=1.0)
    stale, _ = claims.acquire(RUN_IDS[:3])
    _as_other_host(claims, stale.lease_id)
    clock.now += 0.9  # within its TTL
    assert claims.held(RUN_IDS) == set(RUN_IDS[:3])
    lease, _ = claims.acquire(RUN_IDS[3:6])
    with Renewer(lease):
        clock.now += 2.5  # > 2 TTLs: the stale lease expired; only a renewal keeps this one
        # the renewer's next renewal (every ttl / 3 s of real time) pushes it past the new now
        deadline = time.monotonic() + 120
        while _expiry(claims, lease.lease_id) < clock.now + 0.5:
            assert time.monotonic() < deadline, "the renewer did not renew the lease"
            time.sleep(0.05)
        assert claims.held(RUN_IDS) == set(RUN_IDS[3:6])
        taker, busy = Claims(store, "s").acquire(RUN_IDS[:6])
    assert busy == set(RUN_IDS[3:6]) and taker.run_ids == set(RUN_IDS[:3])
    # the expired holder finds out before committing
    assert stale.owned() == set()
    assert taker.owned() == set(RUN_IDS[:3])
    clock.now += 2.5  # no renewer now: the lease expires
    assert claims.held(RUN_IDS) == set(RUN_IDS[:3])
    for lease_ in (lease, taker, stale):
        lease_.release()
    assert not list((tmp_path / "claims").rglob("r*"))
    assert not list((tmp_path / "claims").rglob("*.json"))


def test_release_keeps_a_newer_holders_claim(tmp_path, clock):
    store = Store.open(str(tmp_path))
    claims = Claims(store, "s", ttl=0.5)
    old, _ = claims.acquire(RUN_IDS[:2])
    _as_other_host(claims, old.lease_id)
    clock.now += 1.0  # past its TTL
    new, busy = claims.acquire(RUN_IDS[:2])
    assert busy == set() and new.run_ids == set(RUN_IDS[:2])
    old.release()  # late release of the expired lease: the new claims stay
    assert new.owned() == set(RUN_IDS[:2])
    with Renewer(new):
        assert claims.held(RUN_IDS) == set(RUN_IDS[:2])
    new.release()


def test_exclusive_create_local_and_on_s3(tmp_path, s3_store):  # noqa: F811
    for store in (Store.open(str(tmp_path)), s3_store):
        path = f"{store.root}/claims/x/p.0"
        assert create_exclusive(store.fs, path, b"first")
        assert not create_exclusive(store.fs, path, b"second")
        assert store.fs.cat_file(path) == b"first"
    assert [p.name for p in (tmp_path / "claims" / "x").iterdir()] == ["p.0"]  # no temp left


def test_claims_on_s3_are_exclusive(s3_store):  # noqa: F811
    a, b = Claims(s3_store, "s"), Claims(s3_store, "s")
    first, _ = a.acquire(RUN_IDS[:4])
    second, busy = b.acquire(RUN_IDS[2:6])
    assert first.run_ids == set(RUN_IDS[:4]) and busy == set(RUN_IDS[2:4])
    assert second.run_ids == set(RUN_IDS[4:6])
    first.release()
    second.release()
    assert a.held(RUN_IDS) == set()


def test_claims_of_sweeps_are_separate(tmp_path):
    store = Store.open(str(tmp_path))
    one, _ = Claims(store, "one").acquire(RUN_IDS[:3])
    two, busy = Claims(store, "two").acquire(RUN_IDS[:3])
    assert busy == set() and two.run_ids == set(RUN_IDS[:3])
    one.release()
    two.release()
