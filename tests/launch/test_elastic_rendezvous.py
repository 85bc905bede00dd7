"""`--nnodes MIN:MAX`: node 0's rendezvous re-forms the group with the nodes present (no TensorFlow, no workers).

Real servers and clients on loopback, in this process: each test drives the rounds as launchers
would (join with ports, hear the cluster or a re-formation) and checks what every node is told.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import free_ports
from tfstrategy.errors import LaunchError
from tfstrategy.launch.coordinator import Reformation
from tfstrategy.launch.elastic import newest_committed_step, reformation_line
from tfstrategy.launch.rendezvous import (
    EventKind,
    JobEvent,
    NodeOptions,
    RendezvousClient,
    RendezvousServer,
    ServerLimits,
)
from tfstrategy.launch.rendezvous.options import parse_nnodes, validate_node_options
from tfstrategy.multiworker import commit

SECRET = b"tfstrategy-test-secret-0123456789"
MASTER_HOST = "127.0.0.2"
LIMITS = ServerLimits(settle_seconds=0.2, heartbeat_seconds=0.5, dead_after=5.0)


class Job:
    """Node 0's server of an elastic job, and a client per node as each node's launcher holds it."""

    def __init__(self, fewest: int, most: int, *, wait: float = 0.0, max_restarts: int = 0) -> None:
        self.port = free_ports(1, MASTER_HOST)[0]
        self.fewest, self.most, self.max_restarts = fewest, most, max_restarts
        self.server = RendezvousServer(self._options(0, wait), workers_per_node=1, max_restarts=max_restarts,
                                       timeout=60, say=lambda _: None, limits=LIMITS)
        self.clients: dict[int, RendezvousClient] = {}

    def _options(self, rank: int, wait: float = 0.0) -> NodeOptions:
        return NodeOptions(nnodes=self.most, min_nodes=self.fewest, rendezvous_wait=wait, node_rank=rank,
                           master_host=MASTER_HOST, master_port=self.port, secret=SECRET,
                           node_address=f"127.0.0.{rank + 2}")

    def connect(self, *ranks: int) -> None:
        for rank in ranks:
            client = RendezvousClient(self._options(rank), workers_per_node=1, max_restarts=self.max_restarts,
                                      interrupted=lambda: False)
            assert client.connect(timeout=30) is None
            self.clients[rank] = client

    def form(self, round_: int, *ranks: int) -> dict[int, JobEvent | None]:
        """Every named node offers one worker's port for ``round_``; what each hears back."""
        with ThreadPoolExecutor(len(ranks)) as pool:
            heard = pool.map(lambda rank: self.clients[rank].form(round_, [42000 + rank]), ranks)
            return dict(zip(ranks, heard))

    def lose(self, rank: int) -> None:
        """The node's launcher dies: its connection closes."""
        self.clients.pop(rank).close()

    def heard(self, rank: int, kind: EventKind) -> JobEvent:
        event = self.clients[rank]._wait((kind,), timeout=30)
        assert event is not None and event.kind is kind, event
        return event

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.server.close()


@pytest.fixture
def job_of():
    jobs: list[Job] = []

    def make(fewest: int, most: int, **options: float) -> Job:
        jobs.append(Job(fewest, most, **options))  # type: ignore[arg-type]
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


def _clusters(heard: dict[int, JobEvent | None]) -> list[int]:
    """The nodes of the round every node heard formed (the same on each)."""
    members = {tuple(event.data["nodes"]) for event in heard.values() if event is not None}
    assert len(members) == 1 and all(e is not None and e.kind is EventKind.CLUSTER for e in heard.values()), heard
    return list(members.pop())


def test_the_first_round_waits_for_more_than_min_then_forms_with_those_present(job_of):
    started = time.monotonic()  # before the server exists: its wait starts at the earliest here (a loaded machine
    job = job_of(1, 3, wait=0.5)  # may take longer than the wait to connect the two nodes)
    job.connect(0, 1)
    heard = job.form(0, 0, 1)
    assert _clusters(heard) == [0, 1] and time.monotonic() - started >= 0.5
    assert heard[1].data["workers"] == ["127.0.0.2:42000", "127.0.0.3:42001"]


def test_the_first_round_forms_at_once_with_max_nodes(job_of):
    job = job_of(1, 2, wait=600)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]


def test_a_lost_node_re_forms_the_others_without_it_and_uses_no_restart(job_of):
    job = job_of(1, 3)
    job.connect(0, 1, 2)
    assert _clusters(job.form(0, 0, 1, 2)) == [0, 1, 2]
    job.lose(1)
    for rank in (0, 2):
        reform = job.heard(rank, EventKind.REFORM)
        assert reform.data["round"] == 1 and reform.data["lost"] == [1] and reform.data["nodes"] == [0, 2]
        assert reform.data["graceful"] is False and "node 1 lost" in reform.data["reason"]
    assert _clusters(job.form(1, 0, 2)) == [0, 2]
    assert job.server.restarts == 0 and job.server.round == 1


def test_a_node_that_joins_while_fewer_than_max_train_re_forms_the_group_gracefully(job_of):
    job = job_of(1, 3)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]
    job.connect(2)
    assert job.clients[2].round == 1  # welcomed into the round that takes it in
    for rank in (0, 1):
        reform = job.heard(rank, EventKind.REFORM)
        assert (reform.data["joined"], reform.data["nodes"], reform.data["graceful"]) == ([2], [0, 1, 2], True)
    heard = job.form(1, 0, 1, 2)
    assert _clusters(heard) == [0, 1, 2]
    assert heard[2].data["workers"][2] == "127.0.0.4:42002"


def test_two_re_formations_in_quick_succession_end_in_one_group(job_of):
    job = job_of(1, 3)
    job.connect(0, 1, 2)
    assert _clusters(job.form(0, 0, 1, 2)) == [0, 1, 2]
    job.lose(2)
    assert job.heard(0, EventKind.REFORM).data["round"] == 1
    job.lose(1)  # lost again while round 1 forms: nobody waits for it
    assert _clusters(job.form(1, 0)) == [0]
    assert job.server.round == 1 and job.server.members == [0]


def test_the_lost_node_comes_back_and_is_taken_in(job_of):
    job = job_of(1, 2)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]
    job.lose(1)
    job.heard(0, EventKind.REFORM)
    assert _clusters(job.form(1, 0)) == [0]
    job.connect(1)  # its launcher started again, same rank
    assert job.heard(0, EventKind.REFORM).data["joined"] == [1]
    assert _clusters(job.form(2, 0, 1)) == [0, 1]


def test_below_min_a_lost_node_is_the_rounds_failure_as_in_a_fixed_job(job_of):
    job = job_of(2, 3, max_restarts=0)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]
    job.lose(1)
    failed = job.heard(0, EventKind.FAILED)
    assert failed.data["restart"] is False and "lost its control connection" in failed.data["reason"]


def test_a_failure_of_the_job_itself_still_counts_against_max_restarts(job_of):
    from tfstrategy.launch.rendezvous.wire import Failed

    job = job_of(1, 2, max_restarts=1)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]
    failure = Failed.bounded(round=0, worker=1, reason="exited with status 3", status=3, time=1000.0,
                             consequential=False, outcome="failed", lines=[], logs=[])
    event = job.clients[1].report_failure(failure)
    assert event is not None and event.data["restart"] is True
    assert job.server.restarts == 1


@pytest.mark.parametrize(("text", "parsed"), [("3", (None, 3)), ("1:4", (1, 4)), ("2:2", (2, 2))])
def test_nnodes_takes_a_count_or_min_max(text, parsed):
    assert parse_nnodes(text) == parsed


@pytest.mark.parametrize("text", ["0:2x", "3:2", "0:2", ":2", "two"])
def test_nnodes_refuses_what_is_no_count_in_one_line(text):
    with pytest.raises(LaunchError, match=f"Received --nnodes '{text}'; expected a node count N, or MIN:MAX"):
        parse_nnodes(text)


def test_an_elastic_job_needs_a_shared_backup_dir():
    from tfstrategy.launch.options import LaunchOptions, validate_launch_options

    node = validate_node_options(NodeOptions(nnodes=3, min_nodes=1, node_rank=1, master_host=MASTER_HOST,
                                             master_port=29400, secret=SECRET))
    with pytest.raises(LaunchError, match=r"--nnodes 1:3 without --backup-dir; .* a file system every node shares"):
        validate_launch_options(LaunchOptions(command=("true",), num_workers=1, nodes=node))


def test_the_reformation_line_names_the_nodes_the_group_and_the_step():
    lost = Reformation(round=2, nodes=(0, 2, 3), lost=(1,))
    assert reformation_line(lost, 2, 1200) == "node 1 lost: going on with 3 nodes (6 workers) from step 1,200 (the newest committed)"
    back = Reformation(round=3, nodes=(0, 1), joined=(1,), graceful=True)
    assert reformation_line(back, 1, None) == ("node 1 joined: going on with 2 nodes (2 workers) from scratch (nothing "
                                               "committed yet); the workers stopped at a step they agreed on")


def test_the_newest_committed_step_is_read_from_every_workers_record(tmp_path):
    for task, steps in (("worker-0", [40, 30]), ("worker-1", [50, 40])):
        (tmp_path / task).mkdir()
        commit.write_record(tmp_path / task, commit.CommitRecord(job_id="j", workers=2, steps=tuple(steps)))
    (tmp_path / "worker-2").mkdir()
    (tmp_path / "worker-2" / commit.RECORD_NAME).write_text(json.dumps({"format": 1}))  # unreadable: skipped
    assert newest_committed_step(tmp_path) == 50 and newest_committed_step(None) is None


def test_a_node_that_leaves_re_forms_the_others_gracefully_and_no_round_waits_for_it(job_of):
    job = job_of(1, 3)
    job.connect(0, 1, 2)
    assert _clusters(job.form(0, 0, 1, 2)) == [0, 1, 2]
    answer = job.clients[2].request_leave(15, timeout=30)  # still connected while its workers stop
    assert answer is not None and answer.kind is EventKind.REFORM
    for rank in (0, 1):
        reform = job.heard(rank, EventKind.REFORM)
        assert (reform.data["lost"], reform.data["nodes"], reform.data["graceful"]) == ([2], [0, 1], True)
    assert _clusters(job.form(1, 0, 1)) == [0, 1]


@pytest.mark.parametrize(("fewest", "leaver"), [pytest.param(2, 1, id="below-min"), pytest.param(1, 0, id="node-0")])
def test_a_leave_the_others_cannot_go_on_without_stops_the_job(job_of, fewest, leaver):
    job = job_of(fewest, 3)
    job.connect(0, 1)
    assert _clusters(job.form(0, 0, 1)) == [0, 1]
    answer = job.clients[leaver].request_leave(15, timeout=30)
    assert answer is not None and answer.kind is EventKind.STOP and answer.data["signal"] == 15
    assert job.heard(1 - leaver, EventKind.STOP).data["node"] == leaver
