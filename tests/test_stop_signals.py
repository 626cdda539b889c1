"""Stop signals (:mod:`pipeline.run._signals`): the first SIGINT or SIGTERM asks, a second
ends at once with its number; the exit status is 128 + that number; a refine and the
gallery stop with the launch a signal stopped instead of going on. The launches
themselves are stopped for real in ``test_faults``."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
import refine_synthetic as syn
import yaml
from optuna.trial import TrialState
from phasesweep.pipeline.run._driver import SweepOutcome
from phasesweep.pipeline.run._signals import Interrupted, on_stop_signals, raise_interrupted
from phasesweep.storage import Store

from phasesweep._cli import main
from phasesweep._cli._base import interrupted_status

PAIRS = [
    (signal.SIGINT, signal.SIGINT),
    (signal.SIGINT, signal.SIGTERM),
    (signal.SIGTERM, signal.SIGINT),
    (signal.SIGTERM, signal.SIGTERM),
]


@pytest.mark.parametrize("first,second", PAIRS)
def test_the_first_stop_signal_asks_a_second_ends_at_once_and_the_handlers_come_back(first, second):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    asked = []
    with pytest.raises(Interrupted) as ended, on_stop_signals(asked.append):
        signal.raise_signal(first)
        assert asked == [first]  # asked, and the block goes on
        signal.raise_signal(second)
        pytest.fail("a second signal must end the block")
    assert asked == [first]
    assert ended.value.signum == second and interrupted_status(ended.value) == 128 + second
    assert {s: signal.getsignal(s) for s in before} == before


def test_exit_status_is_128_plus_the_signal_and_130_for_pythons_own_ctrl_c():
    assert interrupted_status(KeyboardInterrupt()) == 130
    assert interrupted_status(Interrupted(signal.SIGINT)) == 130
    assert interrupted_status(Interrupted(signal.SIGTERM)) == 143
    assert isinstance(Interrupted(signal.SIGTERM), KeyboardInterrupt)


def test_raise_interrupted_is_sigterms_counterpart_of_pythons_ctrl_c_handler():
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        with pytest.raises(Interrupted) as ended:
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended.value.signum == signal.SIGTERM


#: A script that takes SIGTERM as a launch makes it take it, records that its exit hooks
#: ran (into argv[1]), then ends as argv[2] says.
ENDING = """
import atexit, pathlib, signal, sys, time
from phasesweep.pipeline.run._signals import Interrupted, take_sigterm_as_interrupt

take_sigterm_as_interrupt()
atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("exit hooks ran"))
print("taken", flush=True)
if sys.argv[2] == "second ctrl-c":
    raise Interrupted(signal.SIGINT)
if sys.argv[2] == "other error":
    raise ValueError("not a stop")
time.sleep(60)
"""


@pytest.mark.process
@pytest.mark.parametrize(
    "ending,status",
    [("sigterm", -signal.SIGTERM), ("second ctrl-c", -signal.SIGINT), ("other error", 1)],
)
def test_an_uncaught_interrupted_ends_the_process_by_its_signal_after_its_exit_hooks(
    ending, status, tmp_path
):
    """A script stopped by SIGTERM outside a launch (after :func:`connect` set the
    handler) ends killed by SIGTERM, as a shell and a scheduler expect (143), not with
    Python's status 1 for an uncaught exception, and a second Ctrl-C by SIGINT (130); its
    exit hooks (Ray's shutdown, the embedded Ray's folder) run first and the traceback is
    shown. Any other error still exits 1."""
    import subprocess
    import sys

    hooks = tmp_path / "hooks"
    proc = subprocess.Popen(
        [sys.executable, "-c", ENDING, str(hooks), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "taken\n"
    if ending == "sigterm":
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert hooks.read_text() == "exit hooks ran"
    shown = {"sigterm": "Interrupted: SIGTERM", "second ctrl-c": "Interrupted: SIGINT"}
    assert shown.get(ending, "ValueError: not a stop") in err.splitlines()[-1]


def test_ray_sets_no_sigterm_handler_while_it_starts_so_a_sigterm_then_is_held():
    """Ray's init sets SIGTERM to its ``sys.exit(15)`` (and its node's start to a handler
    of its own), through one setter: a SIGTERM during the start-up was Ray's to take, and
    a ``SystemExit`` raised in an at-fork callback is lost (a launch SIGTERMed then
    trained its sweep and exited 0). While the start-up block runs the setter sets
    nothing: the signal is held and ends the start-up after it."""
    import inspect

    import ray._private.node as ray_node
    import ray._private.utils as ray_utils
    import ray._private.worker as ray_worker
    from phasesweep.pipeline.run._ray import hold_stop_signals

    for sets_a_handler in (ray_worker.init, ray_node.Node._register_shutdown_hooks):
        assert "ray._private.utils.set_sigterm_handler(" in inspect.getsource(sets_a_handler)
    setter = ray_utils.set_sigterm_handler

    def rays_handler(signum, frame):
        raise SystemExit(signum)

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Interrupted) as ended, hold_stop_signals():
            ray_utils.set_sigterm_handler(rays_handler)  # as Ray's init does
            assert signal.getsignal(signal.SIGTERM) is not rays_handler
            signal.raise_signal(signal.SIGTERM)  # held: the block goes on
            started = True
        assert started and ended.value.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ray_utils.set_sigterm_handler is setter


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_cli_exits_128_plus_the_signal_without_a_traceback(stop, capsys, tmp_path, monkeypatch):
    from phasesweep import _api

    def stopped(*args, **kwargs):
        raise Interrupted(stop)

    monkeypatch.setattr(_api, "analyze", stopped)
    assert main(["analyze", "synth", "--store", str(tmp_path)]) == 128 + stop
    assert capsys.readouterr().err == "phasesweep: interrupted\n"


def _interrupted(total: int, stop: signal.Signals) -> SweepOutcome:
    outcome = SweepOutcome(total=total, skipped=0)
    outcome.interrupted, outcome.interrupted_by = True, stop
    return outcome


def test_a_refine_ends_with_the_batch_a_signal_stopped_and_a_resume_goes_on(tmp_path, monkeypatch):
    """On Ray, batch 2's launch is stopped by SIGTERM: the refine raises it (it went on
    with the next batch, so Ctrl-C could not stop a refine), batch 1's runs stay done,
    batch 2's trials fail, and the next refine trains the rest, each run once. Each
    batch's launch checkpoints as the sweep's spec says (it used 300 s whatever the spec)."""
    import phasesweep.pipeline.run._driver as driver
    from phasesweep.pipeline.refine._refine import child_name, plan_refinement, refine
    from phasesweep.pipeline.run._trial import train_and_store

    store = Store.open(str(tmp_path / "store"))
    syn.make_parent(store)
    store.write_spec(
        "synth", yaml.safe_dump({**syn.PARENT, "execution": {"commit_every_seconds": 7}})
    )
    log = str(tmp_path / "trained.log")
    launches = []

    def run_chunks(store, sweep, chunks, *, total, commit_every, **kwargs):
        launches.append(commit_every)
        if len(launches) == 2:
            return _interrupted(total, signal.SIGTERM)
        for c in chunks:
            train_and_store(store.uri, sweep, c, "cpu")
        return SweepOutcome(total=total, skipped=0, trained=total)

    monkeypatch.setattr(driver, "run_chunks", run_chunks)
    real = syn.install(log)
    try:
        with pytest.raises(Interrupted) as ended:
            refine(
                store.uri, "synth", "final_train_loss", syn.LEVEL, tol=syn.TOL, log=lambda m: None
            )
    finally:
        import phasesweep.pipeline.train._trainer as trainer

        trainer.train_chunk = real
    assert ended.value.signum == signal.SIGTERM
    assert launches == [7, 7]
    child = child_name("synth", "final_train_loss")
    assert len(store.done_run_ids(child)) == 4  # batch 1: two lines x two seeds
    p = plan_refinement(store, "synth", "final_train_loss", syn.LEVEL)
    with p.study() as (study, *_):
        states = Counter(t.state for t in study.get_trials())
    assert states == {TrialState.COMPLETE: 2, TrialState.FAIL: 2}

    assert syn.run(store.uri, log).trained == 12
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16


def test_the_gallery_checks_nothing_of_a_sweep_a_signal_left_partly_trained(tmp_path, monkeypatch):
    """The launch of a result's sweep is stopped: ``reproduce`` raises the signal before
    analyzing (it went on to check and record the partial sweep, then the next result)."""
    import phasesweep.pipeline.run._launch as launch

    from phasesweep._gallery import RESULTS
    from phasesweep._gallery._gallery import reproduce

    monkeypatch.setattr(
        launch, "execute", lambda plan, **kw: _interrupted(plan.total, signal.SIGINT)
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # planning counts this machine's CPUs
    store = Store.open(str(tmp_path / "store"))
    with pytest.raises(Interrupted) as ended:
        reproduce(next(iter(RESULTS.values())), store, tmp_path / "figures")
    assert ended.value.signum == signal.SIGINT
    assert not list((tmp_path / "store").rglob("*.parquet"))
    assert not (tmp_path / "figures").exists()


@pytest.mark.process
def test_at_an_interactive_prompt_an_uncaught_interrupted_leaves_the_session_going(tmp_path):
    """``python -i``: the Interrupted of a second Ctrl-C is shown and the prompt takes the
    next line, as after Python's own KeyboardInterrupt; the exit hooks run at its end."""
    import subprocess
    import sys

    hooks = tmp_path / "hooks"
    done = subprocess.run(
        [sys.executable, "-i", "-c", ENDING, str(hooks), "second ctrl-c"],
        input="print('still here')\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Interrupted: SIGINT" in done.stderr and "still here" in done.stdout
    assert hooks.read_text() == "exit hooks ran"
