"""The diagnosis across nodes (``--nnodes``, pure): each node sends node 0 its workers' compact views with its
failure; node 0 diagnoses over every node's views, and checks each view on receipt like every wire message."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re

import pytest
from planted_causes import GOES_ON, HEADLINES, PREFIX

from tfstrategy.contract import bounds
from tfstrategy.launch.ledger import FunctionTrace, Ledger
from tfstrategy.launch.ledger_diagnosis import PREPARE_HINT, WorkerView, view_from_wire, view_to_wire
from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
from tfstrategy.launch.nodes import failure_from_event, failure_to_message
from tfstrategy.launch.rendezvous import EventKind, JobEvent, wire
from tfstrategy.launch.rendezvous.root_cause import across_nodes, root_cause
from tfstrategy.launch.rendezvous.wire import RoundFailed
from tfstrategy.launch.reports import ErrorRecord, Progress
from tfstrategy.launch.states import Failure

TRAIN = FunctionTrace(kind="train", fingerprint="a1b2c3", collectives=2, summary="Sequential: 2 variables")
ABORT = "raised CancelledError: Collective ops is aborted by: ... (a consequence of a failure elsewhere)"


def _ledger(**fields) -> Ledger:
    base = dict(epoch=0, batches=3, steps=3, total_steps=3, functions=(TRAIN,), frame="train.py:30 in main")
    return Ledger(**{**base, **fields})


def _failed(node_views: list[WorkerView], worker: int, time: float) -> dict:
    """A node's failure message as node 0 receives it: encoded, then parsed and checked by the wire."""
    message = wire.Failed.bounded(round=0, worker=worker, reason=ABORT, status=1, time=time, consequential=True,
                                  outcome="failed", lines=(), logs=(),
                                  views=[view_to_wire(view) for view in node_views])
    return json.loads(json.dumps({"type": message.kind, **dataclasses.asdict(message)}))


def _node0_decides(*nodes: tuple[list[WorkerView], int, float]) -> tuple[int, wire.Failed] | None:
    received = [(rank, wire.parse_message(_failed(*node), wire.TO_SERVER)) for rank, node in enumerate(nodes)]
    checked = [(rank, message) for rank, message in received if isinstance(message, wire.Failed)]
    return across_nodes(sorted(checked, key=lambda item: item[1].time))


def test_uneven_shards_on_two_nodes_are_named_by_node_0():
    waiting = WorkerView(index=0, ledger=_ledger(batches=8, steps=7), steps=7, in_step=True, joined=True)
    short = WorkerView(index=1, ledger=_ledger(batches=8, steps=7, end_of_data=((0, 8),)), steps=7, joined=True)
    decided = _node0_decides(([waiting], 0, 100.0), ([short], 1, 100.5))
    assert decided is not None
    rank, cause = decided
    assert (rank, cause.worker, cause.consequential) == (1, 1, False)
    assert cause.diagnosis[0] == ("worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 waits in "
                                  f"batch 8: the shards differ by one batch ({PREPARE_HINT})")


def test_different_train_functions_on_two_nodes_are_named_by_node_0():
    other = FunctionTrace(kind="train", fingerprint="ffee99", collectives=3, summary="Sequential: 4 variables")
    zero = WorkerView(index=0, ledger=_ledger(), steps=0, in_step=True, joined=True, returncode=1)
    one = WorkerView(index=1, ledger=_ledger(functions=(other,)), steps=0, in_step=True, joined=True, returncode=1)
    # node 1 reports first: the workers are still named in their order
    decided = _node0_decides(([one], 1, 100.0), ([zero], 0, 100.2))
    assert decided is not None and decided[1].diagnosis[0] == "workers 0 and 1 traced different train functions (step 1)"
    assert "worker 1: Sequential: 4 variables, 3 collective(s) a step [fingerprint ffee99]" in decided[1].diagnosis


def test_different_models_on_two_nodes_are_named_by_node_0():
    def built(*weights: tuple[str, str]) -> Ledger:
        return Ledger(extra={"weights": {"count": len(weights), "last": [[n, *w] for n, w in enumerate(weights, 1)]}})

    zero = WorkerView(index=0, ledger=built(("dense/kernel", "(4, 8)")), joined=True)
    one = WorkerView(index=1, ledger=built(("dense/kernel", "(4, 16)")), joined=True)
    decided = _node0_decides(([zero], 0, 100.0), ([one], 1, 100.2))
    assert decided is not None and decided[0] == 0
    assert decided[1].diagnosis[0] == ("workers 0 and 1 built different models: weight 1 is dense/kernel (4, 8) on "
                                       "worker 0 and dense/kernel (4, 16) on worker 1")


def test_healthy_views_on_every_node_are_no_diagnosis_and_a_view_survives_the_wire_whole():
    view = WorkerView(index=3, ledger=_ledger(end_of_data=((0, 8),), extra={"epoch_steps": 8}), steps=3,
                      in_step=True, joined=True, error_type="ValueError")
    assert _node0_decides(([view], 0, 1.0), ([WorkerView(index=4, ledger=_ledger(), steps=3, joined=True)], 1, 2.0)) \
        is None
    back = view_from_wire(json.loads(json.dumps(view_to_wire(view))))
    assert (back.index, back.steps, back.in_step, back.joined, back.error_type) == (3, 3, True, True, "ValueError")
    assert back.ledger is not None and back.ledger.end_of_data == ((0, 8),) and back.ledger.functions == (TRAIN,)
    assert back.ledger.extra["epoch_steps"] == 8


def _sent(view: dict) -> dict:
    return _failed([], 0, 1.0) | {"views": [view]}


GOOD = view_to_wire(WorkerView(index=1, ledger=_ledger(), steps=3, joined=True))


@pytest.mark.parametrize(("view", "reported"), [
    pytest.param("x", r"failed\.views\[0\] is 'x'; expected an object of", id="not-an-object"),
    pytest.param({**GOOD, "extra": 1}, r"failed\.views\[0\] is .*; expected an object of", id="extra-key"),
    pytest.param({k: v for k, v in GOOD.items() if k != "joined"}, r"failed\.views\[0\] is", id="missing-key"),
    pytest.param({**GOOD, "index": -1}, r"failed\.views\[0\]\.index is -1; expected an integer", id="negative-index"),
    pytest.param({**GOOD, "joined": 1}, r"failed\.views\[0\]\.joined is 1; expected true or false", id="joined-int"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "batches": "8"}},
                 r"failed\.views\[0\]\.ledger\.batches is '8'; expected an integer", id="batches-text"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "end_of_data": [[0, 8]] * 9}},
                 r"ledger\.end_of_data is .*; expected a list of at most 8", id="too-many-ends"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "end_of_data": [[0]]}},
                 r"ledger\.end_of_data\[0\] is '\[0\]'; expected a pair", id="end-not-a-pair"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "functions": [{"kind": "train"}]}},
                 r"ledger\.functions\[0\] is .*; expected an object of", id="function-missing-keys"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "frame": "x" * 301}},
                 r"ledger\.frame is 'x+'; expected text of at most 300", id="frame-too-long"),
    pytest.param({**GOOD, "ledger": {**GOOD["ledger"], "weights": [[1, "w", 3]]}},
                 r"ledger\.weights\[0\]\[2\] is '3'; expected text", id="weight-shape-not-text"),
])
def test_a_malformed_view_is_a_protocol_error_on_receipt(view, reported):
    with pytest.raises(wire.ProtocolError, match=reported):
        wire.parse_message(_sent(view), wire.TO_SERVER)


def test_too_many_views_is_a_protocol_error_and_a_sender_cuts_them_to_the_bound():
    with pytest.raises(wire.ProtocolError, match=r"failed\.views is .*; expected a list of at most 64"):
        wire.parse_message(_failed([], 0, 1.0) | {"views": [GOOD] * 65}, wire.TO_SERVER)
    cut = wire.Failed.bounded(round=0, worker=0, reason="x", status=1, time=1.0, consequential=False,
                              outcome="failed", lines=(), logs=(), views=[GOOD] * 100)
    assert len(cut.views) == wire.VIEWS == 64



# --- each ledger field crosses the wire as its declaration says (tfstrategy.contract.bounds) ------------------


def _inside(bound: bounds.Bound) -> object:
    """A value at the edge of ``bound`` (never a field's default, so a field left behind shows)."""
    if isinstance(bound, bounds.Count):
        return bound.low + 5
    if isinstance(bound, bounds.Text):
        return "t" * bound.limit
    if isinstance(bound, bounds.StepSeconds):
        return 0.25
    if isinstance(bound, bounds.WallClock):
        return 1.7e9
    if isinstance(bound, bounds.Last):
        return tuple(_inside(bound.item) for _ in range(bound.limit))
    if isinstance(bound, bounds.Pair):
        return (_inside(bound.first), _inside(bound.second))
    assert isinstance(bound, bounds.Nested), bound
    return bound.record(**{name: _inside(item) for name, item in bounds.sent_fields(bound.record)})


def _beyond(bound: bounds.Bound) -> object:
    """A value past ``bound``, as a worker's file may hold one."""
    if isinstance(bound, bounds.Count):
        return bound.low - 7
    if isinstance(bound, bounds.Text):
        return "o" * (bound.limit + 9)
    if isinstance(bound, bounds.StepSeconds):
        return float("inf")
    if isinstance(bound, bounds.WallClock):
        return float("nan")
    if isinstance(bound, bounds.Last):
        return tuple(_beyond(bound.item) for _ in range(bound.limit + 3))
    if isinstance(bound, bounds.Pair):
        return (_beyond(bound.first), _beyond(bound.second))
    assert isinstance(bound, bounds.Nested), bound
    return bound.record(**{name: _beyond(item) for name, item in bounds.sent_fields(bound.record)})


def _received(ledger: Ledger) -> Ledger:
    view = WorkerView(index=0, ledger=ledger, steps=3, joined=True)
    message = wire.parse_message(_failed([view], 0, 1.0), wire.TO_SERVER)
    assert isinstance(message, wire.Failed)
    back = view_from_wire(message.views[0]).ledger
    assert back is not None
    return back


def test_every_ledger_field_crosses_the_wire_whole_as_it_declares():
    sent = {name: _inside(bound) for name, bound in bounds.sent_fields(Ledger)}
    back = _received(Ledger(**sent))
    assert {name: getattr(back, name) for name in sent} == sent
    assert set(view_to_wire(WorkerView(index=0, ledger=Ledger()))["ledger"]) == {*sent, "epoch_steps", "weights"}


def test_a_worker_file_past_every_bound_is_cut_to_what_node_0_accepts():
    back = _received(Ledger(**{name: _beyond(bound) for name, bound in bounds.sent_fields(Ledger)}))
    assert (back.epoch, back.steps, back.step_seconds, back.time) == (-1, 0, None, 0.0)
    assert len(back.functions) == 8 and back.functions[-1].summary == "o" * 300
    assert back.py_function == "o" * 300 and len(back.end_of_data) == 8


def test_a_field_added_to_the_ledger_crosses_the_wire_with_no_edit_but_its_declaration():
    rate = dataclasses.field(default=None, metadata=bounds.on_wire(bounds.StepSeconds()))
    optimizer = dataclasses.field(default="", metadata=bounds.on_wire(bounds.Text(40)))
    grown = dataclasses.make_dataclass("Grown", [("learning_rate", "float | None", rate), ("optimizer", str, optimizer)],
                                       bases=(Ledger,), frozen=True, kw_only=True)
    ledger = grown(**{name: _inside(bound) for name, bound in bounds.sent_fields(grown)})
    sent = json.loads(json.dumps(bounds.to_wire(ledger)))
    assert sent["learning_rate"] == 0.25 and sent["optimizer"] == "t" * 40
    check = wire.record_check(grown)
    assert bounds.from_wire(grown, check(sent, "ledger")) == ledger
    with pytest.raises(wire.ProtocolError, match=r"ledger\.optimizer is 'x+'; expected text of at most 40"):
        check({**sent, "optimizer": "x" * 41}, "ledger")
    assert bounds.to_wire(dataclasses.replace(ledger, optimizer="x" * 41))["optimizer"] == "x" * 40


def test_a_field_that_declares_no_bound_is_refused_with_how_to_declare_it():
    forgot = dataclasses.make_dataclass("Forgot", [("learning_rate", float, dataclasses.field(default=0.0))],
                                        bases=(Ledger,), frozen=True, kw_only=True)
    with pytest.raises(TypeError, match=r"Received Forgot\.learning_rate with no bound .* metadata=on_wire\("):
        bounds.to_wire(forgot())


#: What each ledger field carries between nodes under each version of the protocol (a digest of the declaration):
#: node 0 refuses a view whose keys or bounds differ, so a change to them raises ``wire.PROTOCOL``.
LEDGER_VIEW_OF_PROTOCOL = {"tfstrategy-rendezvous/8": "5517e6c152d57252"}


def _declared(record: type) -> list[tuple[str, str]]:
    return [(name, repr(_declared(bound.record)) if isinstance(bound, bounds.Nested) else repr(bound))
            for name, bound in bounds.sent_fields(record)]


def test_a_change_to_what_a_ledger_carries_between_nodes_raises_the_protocol():
    digest = hashlib.sha256(repr(_declared(Ledger)).encode()).hexdigest()[:16]
    assert LEDGER_VIEW_OF_PROTOCOL.get(wire.PROTOCOL) == digest, (
        f"the ledger's fields on the wire changed (digest {digest}): raise wire.PROTOCOL and record "
        f"{{PROTOCOL: {digest!r}}} in LEDGER_VIEW_OF_PROTOCOL")

def test_a_node_whose_worker_only_waits_shares_its_views_and_node_0_diagnoses_with_them():
    """Uneven shards: worker 1 fails after its data ran out; worker 0 (node 0) waits, alive, and reports no
    failure; the views node 0 last received from it (a checked Views message) complete the picture."""
    waiting = WorkerView(index=0, ledger=_ledger(batches=8, steps=7), steps=7, in_step=True, joined=True)
    short = WorkerView(index=1, ledger=_ledger(batches=8, steps=7, end_of_data=((0, 8),)), steps=7, joined=True,
                       returncode=1)
    failed = wire.parse_message(_failed([short], 1, 100.5), wire.TO_SERVER)
    shared = wire.parse_message({"type": "views", "round": 0, "views": [view_to_wire(waiting)]}, wire.TO_SERVER)
    assert isinstance(failed, wire.Failed) and isinstance(shared, wire.Views)
    assert across_nodes([(1, failed)]) is None  # one node's views alone show no cause
    decided = across_nodes([(1, failed)], {0: shared.views})
    assert decided is not None and decided[0] == 1 and decided[1].diagnosis[0].startswith(
        "worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 waits in batch 8")
    with pytest.raises(wire.ProtocolError, match=r"views\.views\[0\]\.steps is 'x'; expected an integer"):
        wire.parse_message({"type": "views", "round": 0, "views": [{**GOOD, "steps": "x"}]}, wire.TO_SERVER)


def test_a_stopped_worker_on_a_node_that_reported_nothing_is_named_on_its_own_node_not_blamed_on_node_0():
    """SIGSTOP on node 1's worker 1 inside a step: worker 0 (node 0) aborts first (TensorFlow's heartbeat
    to the stopped task) and reports; node 1, its stall not yet timed out, only shared its view."""
    aborted = WorkerView(index=0, ledger=_ledger(steps=96), steps=96, in_step=True, joined=True, returncode=1)
    stopped = WorkerView(index=1, ledger=_ledger(steps=96), steps=96, in_step=True, joined=True, stopped=True)
    failed = wire.parse_message(_failed([aborted], 0, 100.0), wire.TO_SERVER)
    shared = wire.parse_message({"type": "views", "round": 0, "views": [view_to_wire(stopped)]}, wire.TO_SERVER)
    assert isinstance(failed, wire.Failed) and isinstance(shared, wire.Views)
    rank, cause = root_cause([(0, failed)], {1: shared.views})
    relayed = failure_from_event(JobEvent(EventKind.FAILED, {}, wire.RoundFailed.of(rank, cause, restart=False)))
    assert (relayed.node, relayed.index, relayed.consequential) == (1, 1, False)
    assert relayed.headline() == "node 1: worker 1 is stopped (SIGSTOP or a debugger) after step 96; its peers wait for it"
    report = relayed.report()
    assert "worker 0" not in report and "CancelledError" not in report, report  # node 0's echo is not worker 1's
    assert "what the launcher saw: node 1 worker 1 was alive on its node" in report, report



@pytest.mark.parametrize("stop_seen_at", [5.0, 15.0])  # before the stall threshold (10 s), and in its tick
def test_node_0_names_a_stop_on_node_1_and_never_blames_its_own_waiting_worker_for_the_stall(stop_seen_at):
    """Worker 1 (node 1) stopped inside step 79, worker 0 (node 0) waits in its collectives: node 0 says the stop
    once and no stall of its own worker (once seen together in the run: 'worker 0 and every other worker have been
    inside batch 79', the wrong cause); node 1's launcher, which sees the stop, times it out, not node 0."""
    monitor = GroupMonitor([0], Policy(stall_report=10, stall_timeout=20), started=0.0, peers_elsewhere=True)
    waiting = Observation(joined=True, progress=Progress(heartbeat=1, steps=78, in_step=True))
    notes: list[str] = []
    for now in (1.0, 2.0, 5.0, 15.0, 25.0, 60.0):
        view = WorkerView(index=1, ledger=_ledger(steps=78), steps=78, in_step=True, joined=True,
                          stopped=now >= stop_seen_at)
        received = wire.parse_message({"type": "views", "round": 0, "views": [view_to_wire(view)]}, wire.TO_SERVER)
        assert isinstance(received, wire.Views)
        seen = {0: dataclasses.replace(waiting, progress=Progress(heartbeat=int(now), steps=78, in_step=True))}
        decision = monitor.update(now, 1000.0 + now, seen, elsewhere=received.views)
        assert decision.outcome is None and decision.failure is None, (now, decision)
        notes += decision.notes
    assert notes == ["stall: node 1: worker 1 is stopped (SIGSTOP or a debugger) after step 78; its peers wait for "
                     "it (said by node 1's launcher)"]


# --- stragglers across nodes: node 0 watches every worker of the job ---------------------------------


def _paced(written: float, *, input_seconds: float, cpu: float = 0.1) -> Ledger:
    return _ledger(total_steps=int(written), step_seconds=0.2, input_seconds=input_seconds, cpu_seconds=cpu,
                   time=written)


def test_a_view_carries_what_the_straggler_watch_reads_and_a_worker_file_cannot_send_odd_values():
    view = WorkerView(index=1, ledger=_paced(1234.5, input_seconds=0.1, cpu=0.05), joined=True)
    back = view_from_wire(json.loads(json.dumps(view_to_wire(view))))
    assert back.ledger is not None
    assert (back.ledger.time, back.ledger.step_seconds, back.ledger.input_seconds, back.ledger.cpu_seconds) == (
        1234.5, 0.2, 0.1, 0.05)
    # input wait a worker times outside tf.data is sent as its input wait
    outside = view_to_wire(WorkerView(index=1, ledger=_ledger(extra={"outside_seconds": 0.3})))
    assert outside["ledger"]["input_seconds"] == 0.3
    # a worker's ledger file may hold anything: what the wire would refuse is sent as unknown
    odd = _ledger(step_seconds=float("nan"), input_seconds=-1.0, cpu_seconds=float("inf"), time=-5.0)
    sent = view_to_wire(WorkerView(index=1, ledger=odd))["ledger"]
    assert (sent["step_seconds"], sent["input_seconds"], sent["cpu_seconds"], sent["time"]) == (None, None, None, 0.0)
    assert isinstance(wire.parse_message(_sent({**GOOD, "ledger": sent}), wire.TO_SERVER), wire.Failed)


def test_a_view_carries_the_py_function_time_and_place_bounded_and_never_as_input():
    place = "/job/" + "d" * 400 + "/train.py:12 in decode"
    ledger = dataclasses.replace(_paced(7.0, input_seconds=0.002), py_function_seconds=0.15, py_function=place)
    data = view_to_wire(WorkerView(index=1, ledger=ledger))
    assert data["ledger"]["input_seconds"] == 0.002  # (not 0.15: no reader adds one to the other)
    back = view_from_wire(wire.parse_message(json.loads(json.dumps(_sent(data))), wire.TO_SERVER).views[0])
    assert back.ledger is not None and back.ledger.py_function_seconds == 0.15
    # a long path keeps its end, the file and function the warning names
    assert back.ledger.py_function == place[-300:] and back.ledger.py_function.endswith("/train.py:12 in decode")
    odd = dataclasses.replace(ledger, py_function_seconds=float("nan"))
    assert view_to_wire(WorkerView(index=1, ledger=odd))["ledger"]["py_function_seconds"] is None


@pytest.mark.parametrize(("field", "value", "reported"), [
    ("step_seconds", float("nan"), r"ledger\.step_seconds is 'nan'; expected null or seconds per step"),
    ("input_seconds", -0.5, r"ledger\.input_seconds is '-0\.5'; expected null or seconds per step"),
    ("cpu_seconds", float("inf"), r"ledger\.cpu_seconds is 'inf'; expected null or seconds per step"),
    ("cpu_seconds", "0.1", r"ledger\.cpu_seconds is '0\.1'; expected null or seconds per step"),
    ("step_seconds", True, r"ledger\.step_seconds is 'True'; expected null or seconds per step"),
    ("input_seconds", 1e7, r"ledger\.input_seconds is '10000000\.0'; expected null or seconds per step, 0\.\.1e\+06"),
    ("py_function_seconds", -0.1, r"ledger\.py_function_seconds is '-0\.1'; expected null or seconds per step"),
    ("py_function", "x" * 301, r"ledger\.py_function is 'x+'; expected text of at most 300 characters"),
    ("py_function", None, r"ledger\.py_function is 'None'; expected text"),
    ("time", None, r"ledger\.time is 'None'; expected seconds since the epoch"),
    ("time", -1.0, r"ledger\.time is '-1\.0'; expected seconds since the epoch"),
])
def test_a_malformed_step_timing_in_a_view_is_a_protocol_error_on_receipt(field, value, reported):
    # NaN and infinity pass through JSON (Python's json reads them): the check is the wire's
    message = json.loads(json.dumps(_sent({**GOOD, "ledger": {**GOOD["ledger"], field: value}})))
    with pytest.raises(wire.ProtocolError, match=reported):
        wire.parse_message(message, wire.TO_SERVER)


def _node0_watch(readings: int, remote_input: float, *, jitter: random.Random | None = None) -> list[str]:
    """Node 0's monitor (worker 0 here) over ``readings`` ticks, worker 1's views arriving from node 1."""
    def paced(tick: int) -> tuple[Ledger, Ledger]:
        scale = (lambda: jitter.uniform(0.5, 2.0)) if jitter else (lambda: 1.0)
        return (_paced(float(tick), input_seconds=0.002 * scale()),
                _paced(float(tick), input_seconds=remote_input * scale()))

    return _node0_watch_ledgers([paced(tick) for tick in range(1, readings + 1)])


def _node0_watch_ledgers(ticks: list[tuple[Ledger, Ledger]]) -> list[str]:
    """Node 0's monitor over ``ticks``: each (worker 0's ledger here, worker 1's as node 1's view brings it)."""
    monitor = GroupMonitor([0], Policy(), started=0.0, peers_elsewhere=True)
    notes: list[str] = []
    for tick, (here, there) in enumerate(ticks, start=1):
        received = wire.parse_message({"type": "views", "round": 0, "views": [
            view_to_wire(WorkerView(index=1, ledger=there, steps=tick, joined=True))]}, wire.TO_SERVER)
        assert isinstance(received, wire.Views)
        seen = {0: Observation(joined=True, ledger=here, progress=Progress(heartbeat=tick, steps=tick, in_step=True))}
        notes += monitor.update(float(tick), 1000.0 + tick, seen, elsewhere=received.views).notes
    return notes


def _epochs_of_a_slow_step(epochs: int) -> list[tuple[Ledger, Ledger]]:
    """Worker 0's and worker 1's ledgers as a loaded machine wrote them (planted ``slow-step``, 8 steps an epoch).

    Worker 1's step burns 0.2 s more CPU; at each epoch's end both do the same work (its reading is not
    slow), then a second or two passes without a step (no timing), as measured under ``--nnodes 2``.
    """
    ticks: list[tuple[Ledger, Ledger]] = []
    for _ in range(epochs):
        readings = [(0.7, 0.02, 0.22)] * 6 + [(2.0, 0.29, 0.37), (None, None, None), (None, None, None)]
        for step, cpu_here, cpu_there in readings:
            written = float(len(ticks) + 1)
            ticks.append(tuple(_ledger(total_steps=int(written), step_seconds=step, input_seconds=None if step is None
                                       else 0.0, cpu_seconds=cpu, time=written) for cpu in (cpu_here, cpu_there)))
    return ticks


def test_node_0_names_a_step_straggler_on_another_node_whose_streak_each_epoch_end_breaks():
    notes = [note for note in _node0_watch_ledgers(_epochs_of_a_slow_step(10)) if "straggler" in note]
    assert len(notes) == 1 and notes[0].startswith("warning: worker 1 is a straggler: its steps take 11.0x its peers' "
                                                   "CPU (0.22 s a step against 0.02 s")


def test_node_0_names_a_straggler_on_another_node_once():
    notes = [note for note in _node0_watch(30, 0.1) if "straggler" in note]
    assert len(notes) == 1
    assert notes[0].startswith("warning: worker 1 is a straggler: it waits 0.10 s a step for its input, 50.0x its "
                               "peers'")


def test_node_0_names_no_straggler_in_a_healthy_jittered_pair_and_another_node_leaves_the_watch_to_it():
    assert [note for note in _node0_watch(300, 0.002, jitter=random.Random(3)) if "straggler" in note] == []
    other = GroupMonitor([1, 2], Policy(), started=0.0, peers_elsewhere=True)  # node 1: elsewhere is None
    notes = []
    for tick in range(1, 31):
        seen = {1: Observation(joined=True, ledger=_paced(float(tick), input_seconds=0.1)),
                2: Observation(joined=True, ledger=_paced(float(tick), input_seconds=0.002))}
        notes += other.update(float(tick), 1000.0 + tick, seen).notes
    assert not any("straggler" in note for note in notes)


def test_node_0_says_at_once_that_a_worker_on_another_node_is_stopped_once_a_stop():
    """Node 1 sees its worker stopped (state T) and shares it: node 0 says it with the next views, not when
    TensorFlow's heartbeat aborts worker 0 10 s or more later; again only after the worker ran and stopped again."""
    monitor = GroupMonitor([0], Policy(), started=0.0, peers_elsewhere=True)
    notes: list[str] = []
    for tick, stopped in enumerate([False, True, True, True, False, True], start=1):
        received = wire.parse_message({"type": "views", "round": 0, "views": [view_to_wire(
            WorkerView(index=1, ledger=_ledger(), steps=11, joined=True, in_step=True, stopped=stopped))]},
            wire.TO_SERVER)
        assert isinstance(received, wire.Views)
        seen = {0: Observation(joined=True, ledger=_ledger(), progress=Progress(heartbeat=tick, steps=11, in_step=True))}
        notes += [(tick, note) for note in monitor.update(float(tick), 1000.0 + tick, seen,
                                                          elsewhere=received.views).notes]
    said = "stall: node 1: worker 1 is stopped (SIGSTOP or a debugger) after step 11; its peers wait for it"
    assert [(tick, note.startswith(said)) for tick, note in notes] == [(2, True), (6, True)]
    other = GroupMonitor([1], Policy(), started=0.0, peers_elsewhere=True)  # node 1 says its own stall itself
    assert not any("node 1" in note for note in other.update(1.0, 1001.0, {1: Observation(joined=True)}).notes)


# --- issue 38's planted causes on two nodes (one worker each), as test_planted's real runs saw them -----------
#
# Each node's launcher is its real GroupMonitor (peers_elsewhere), fed what its worker showed in the real run
# (``tests/workers/planted_worker.py``: its ledger, progress and error record); its failure goes to node 0 as
# the supervisor sends it (``failure_to_message`` with ``wire_views()``), through JSON and the wire's checks;
# node 0 decides with the real ``root_cause`` and relays it (``RoundFailed``), and the headline node 0 prints
# must match the one test_planted searches on the real console. A real run of each capability stays in
# test_planted: different-model (diagnosed from every node's views), exit0 (a node's own diagnosis relayed),
# slow-input (node 0 watching node 1's worker, in the SIGSTOP test).

PLANTED_FRAME = "/work/main/tests/workers/planted_worker.py:{} in main"
#: The planted worker's model (Dense(hidden), Dense(1) on 4 features): its weights as the ledger records them.
MODEL = (("dense/kernel", "(4, {})"), ("dense/bias", "({},)"), ("dense_1/kernel", "({}, 1)"), ("dense_1/bias", "(1,)"))
PLANTED_TRAIN = FunctionTrace(kind="train", fingerprint="46052a2df32dcadd", collectives=2,
                              summary="175 ops, 13 variable reads")
#: TensorFlow's errors in the real runs: a collective that never meets aborts (an echo: settled, then relayed).
MISMATCH = ("tensorflow.python.framework.errors_impl.InvalidArgumentError",
            "Collective ops is aborted by: Shape mismatch in the collective instance 112. Op at device "
            "/job:worker/replica:0/task:0/device:CPU:0 expected shape [49] but another member in the group expected "
            "shape [3].")
BROADCAST_MISMATCH = ("tensorflow.python.framework.errors_impl.InvalidArgumentError",
                      "Collective ops is aborted by: Shape mismatch in the collective instance 100.")
TYPE_MISMATCH = ("tensorflow.python.framework.errors_impl.InternalError",
                 "Collective ops is aborted by: Collective instance 145 expected type 0 and data_type 9 but got type 0 "
                 "and data_type 1")


def _built(hidden: int, count: int = 4) -> dict[str, object]:
    """The ledger's record of the model weights a worker created (the first ``count``)."""
    return {"count": count, "last": [[n, name, shape.format(hidden)]
                                     for n, (name, shape) in enumerate(MODEL[:count], 1)]}


def _planted_ledger(hidden: int = 8, count: int = 4, **fields) -> Ledger:
    extra = {"loop": "fit", **fields.pop("extra", {}), "weights": _built(hidden, count)}
    return Ledger(**{"frame": PLANTED_FRAME.format(138), **fields, "extra": extra})


class _Node:
    """One node's launcher with one worker (worker ``rank``): its real monitor, the failure it would send node 0."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.monitor = GroupMonitor([rank], Policy(join_timeout=120, stall_report=10, stall_timeout=20), started=0.0,
                                    peers_elsewhere=True)
        self.failed: dict | None = None

    def see(self, now: float, seen: Observation) -> None:
        decision = self.monitor.update(now, 1000.0 + now, {self.rank: seen})
        if decision.failure is not None and self.failed is None:  # as the supervisor reports it
            local = dataclasses.replace(decision.failure, views=self.monitor.wire_views())
            message = failure_to_message(0, local)
            self.failed = json.loads(json.dumps({"type": message.kind, **dataclasses.asdict(message)}))

    def shared(self) -> dict:
        return json.loads(json.dumps({"type": "views", "round": 0, "views": list(self.monitor.wire_views())}))


def _node_0_says(timeline: dict[int, list[tuple[float, Observation]]]) -> Failure:
    """Run each node's monitor over its worker's ``timeline`` (rank: [(when, what it showed)]), a tick a second;
    node 0 decides over the failures the nodes sent (and the views of those that sent none); what it relays."""
    nodes = {rank: _Node(rank) for rank in timeline}
    for tick in range(1, 13):
        for rank, node in nodes.items():
            seen = [observation for when, observation in timeline[rank] if when <= tick]
            if seen and node.failed is None:
                node.see(float(tick), seen[-1])
    reported = [(rank, wire.parse_message(node.failed, wire.TO_SERVER)) for rank, node in nodes.items() if node.failed]
    assert reported, "no node reported a failure"
    shared = {rank: wire.parse_message(node.shared(), wire.TO_SERVER) for rank, node in nodes.items()
              if not node.failed}
    assert all(isinstance(message, wire.Failed) for _, message in reported)
    assert all(isinstance(message, wire.Views) for message in shared.values())
    rank, cause = root_cause(sorted(reported, key=lambda item: item[1].time),
                             {rank: message.views for rank, message in shared.items()})
    relayed = RoundFailed.of(rank, cause, restart=False)
    back = wire.parse_message(json.loads(json.dumps({"type": relayed.kind, **dataclasses.asdict(relayed)})),
                              wire.TO_CLIENT)
    return failure_from_event(JobEvent(EventKind.FAILED, {}, back))


def _training(ledger: Ledger, steps: int, in_step: bool) -> Observation:
    return Observation(joined=True, ledger=ledger, progress=Progress(heartbeat=steps + 1, steps=steps, in_step=in_step))


def _aborted(ledger: Ledger, error: tuple[str, str], when: float) -> Observation:
    return Observation(returncode=1, ledger=ledger, error=ErrorRecord(type=error[0], message=error[1], frame="",
                                                                      time=1000.0 + when))


def _planted_timeline(cause: str) -> dict[int, list[tuple[float, Observation]]]:
    """What worker 0 (node 0) and worker 1 (node 1) showed their launchers in test_planted's real run of ``cause``."""
    if cause == "uneven":  # worker 1 plans 7 batches, worker 0 8; at worker 0's 8th, both abort (a type mismatch)
        zero = _planted_ledger(epoch=0, batches=8, steps=7, total_steps=7, functions=(PLANTED_TRAIN,),
                               extra={"epoch_steps": 8})
        one = _planted_ledger(epoch=0, batches=7, steps=7, total_steps=7, functions=(PLANTED_TRAIN,),
                              extra={"epoch_steps": 7})
        return {0: [(1, _training(zero, 7, True)), (4, _aborted(zero, TYPE_MISMATCH, 3.6))],
                1: [(1, _training(one, 7, False)), (3, _aborted(one, TYPE_MISMATCH, 3.0))]}
    if cause == "different-step":  # worker 1's loss issues one more all-reduce: both abort inside the first batch
        other = FunctionTrace(kind="train", fingerprint="c0ac6eb9dc98a78e", collectives=3,
                              summary="198 ops, 13 variable reads")
        zero = _planted_ledger(epoch=0, batches=1, functions=(PLANTED_TRAIN,), extra={"epoch_steps": 8})
        one = _planted_ledger(epoch=0, batches=1, functions=(other,), extra={"epoch_steps": 8})
        return {0: [(1, _training(zero, 0, True)), (3, _aborted(zero, MISMATCH, 2.5))],
                1: [(1, _training(one, 0, True)), (4, _aborted(one, MISMATCH, 3.2))]}
    if cause == "different-model":  # worker 1's hidden layer is wider: the first weight's broadcast aborts
        zero, one = _planted_ledger(8, count=1), _planted_ledger(16, count=1)
        return {0: [(1, Observation(joined=True, ledger=zero)), (4, _aborted(zero, BROADCAST_MISMATCH, 3.4))],
                1: [(1, Observation(joined=True, ledger=one)), (3, _aborted(one, BROADCAST_MISMATCH, 2.9))]}
    # exit0/exit1: worker 1 imports TensorFlow and exits before creating its strategy; worker 0 creates its own
    # and waits for it (its node reports nothing: the job cannot form until --timeout)
    before = Ledger(frame=PLANTED_FRAME.format(58))
    waiting = Observation(starting=True, listening=True, progress=Progress(heartbeat=1, steps=-1, in_step=False),
                          ledger=Ledger(frame=PLANTED_FRAME.format(69)))
    return {0: [(1, waiting)],
            1: [(1, Observation(progress=Progress(heartbeat=1, steps=-1, in_step=False), ledger=before)),
                (2, Observation(returncode=int(cause[-1]), ledger=before))]}


#: The node whose name precedes node 0's headline in the real runs (a diagnosis naming two workers: the earliest
#: failure's node).
PLANTED_NODE = {"uneven": 1, "different-step": 0, "different-model": 1, "exit0": 1, "exit1": 1}


@pytest.mark.parametrize("cause", list(PLANTED_NODE))
def test_node_0_says_each_planted_causes_headline_from_the_views_node_1_sends(cause):
    """test_planted's two-node assertion for each failure cause: node 0's headline (and the job's exit status),
    decided over every node's views as they cross the rendezvous."""
    relayed = _node_0_says(_planted_timeline(cause))
    said = "tfstrategy launch: " + relayed.report()
    pattern, status = HEADLINES[cause]
    assert re.search(PREFIX + pattern, said), said
    assert said.startswith(f"tfstrategy launch: node {PLANTED_NODE[cause]}: "), said
    assert relayed.exit_status == status if status is not None else relayed.exit_status != 0, said
    assert not relayed.consequential, said
    if cause.startswith("exit"):
        assert "  the workers on the other nodes wait for it to create its strategy (--nnodes)" in said, said
        assert f"  worker 1's last frame in your code: {PLANTED_FRAME.format(58)}" in said, said
    else:  # both workers' part of the evidence: each node's views reached node 0
        assert re.search(r"^  worker 0: .*\n  worker 1: ", said, re.M), said


def _straggler_readings(cause: str, readings: int) -> list[tuple[Ledger, Ledger]]:
    """Worker 0's and worker 1's ledgers, one a second, as the planted straggler causes write them: the first two
    without step timing (tracing), then a step a fifth of a second on both (in a synchronous job the fast worker
    waits for the slow one inside the collectives), with a loaded machine's jitter."""
    jitter = random.Random(38)
    ticks: list[tuple[Ledger, Ledger]] = []
    for tick in range(1, readings + 1):
        def ledger(slow: bool, tick: float = float(tick)) -> Ledger:
            if tick <= 2:
                return _ledger(total_steps=0, time=tick)
            scale = jitter.uniform(0.7, 1.4)
            if cause == "slow-input":  # worker 1's generator sleeps 0.2 s before each batch
                wait, cpu = (0.10 if slow else 0.001) * scale, 0.03 * scale
            else:  # slow-step: a thread of worker 1 burns CPU; every step sleeps 0.1 s in a numpy_function
                wait, cpu = 0.0, (0.22 if slow else 0.02) * scale
            return _ledger(total_steps=int(5 * tick), step_seconds=0.2 * scale, input_seconds=wait, cpu_seconds=cpu,
                           time=tick)
        ticks.append((ledger(False), ledger(True)))
    return ticks


@pytest.mark.parametrize("cause", ["slow-input", "slow-step"])
def test_node_0_warns_of_each_planted_straggler_on_node_1_in_test_planteds_words(cause):
    """test_planted's two-node assertion for each straggler cause: node 0, watching node 1's worker from the views
    node 1 sends, says its warning once, with its evidence, the job going on, and no stall."""
    notes = _node0_watch_ledgers(_straggler_readings(cause, 20))
    said = "".join(f"tfstrategy launch: {note}\n" for note in notes)
    pattern, _ = HEADLINES[cause]
    assert len(re.findall(PREFIX + pattern, said)) == 1, said
    assert re.search(PREFIX + pattern + GOES_ON, said), said
    assert "stall" not in said, said
