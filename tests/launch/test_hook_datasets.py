"""The hook's ``data_sharding`` step: which datasets it counts, and what it changes (real tf.data, no processes).

The whole job, two workers reading one TFRecord file under ``launch -n 2``, is the corpus case
``tfrecord-subprocess`` (tests/corpus).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from tfstrategy.runtime import hook_datasets
from tfstrategy.runtime.hook_datasets import fewest_files
from tfstrategy.state.registry import RUNTIME

AUTO, DATA = tf.data.experimental.AutoShardPolicy.AUTO, tf.data.experimental.AutoShardPolicy.DATA


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("records")
    paths = []
    for index in range(3):
        path = str(directory / f"part-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            writer.write(b"x" * (index + 1))
        paths.append(path)
    (directory / "lines.txt").write_text("a\nb\n")
    return paths


def _parse(record):
    return tf.strings.length(record)


def test_the_files_of_constant_reader_lists_are_counted(records):
    assert fewest_files(tf.data.TFRecordDataset([records[0]]).map(_parse).batch(2)) == 1
    assert fewest_files(tf.data.TFRecordDataset(records[0])) == 1  # one name, not a list
    assert fewest_files(tf.data.TFRecordDataset(records).shuffle(4).batch(2).prefetch(1)) == 3
    lines = str(Path(records[0]).parent / "lines.txt")
    assert fewest_files(tf.data.TextLineDataset([lines])) == 1
    both = tf.data.Dataset.zip((tf.data.TFRecordDataset(records), tf.data.TextLineDataset([lines])))
    assert fewest_files(both) == 1  # the reader with the fewest files decides


def test_files_listed_by_pattern_are_counted_as_tensorflow_counts_them(records):
    listed = tf.data.Dataset.list_files(str(Path(records[0]).parent / "*.tfrecord"), shuffle=True)
    assert fewest_files(listed.interleave(tf.data.TFRecordDataset)) == 3


def test_datasets_without_files_or_sharded_by_the_script_are_not_counted(records):
    assert fewest_files(tf.data.Dataset.range(8).batch(2)) is None  # no files: TensorFlow shards by element itself
    assert fewest_files(tf.data.TFRecordDataset([records[0]]).shard(2, 1)) is None  # sharding again would drop data
    generated = tf.data.Dataset.from_generator(lambda: iter([1, 2]), output_signature=tf.TensorSpec((), tf.int64))
    assert fewest_files(generated) is None


class _Extended:
    """What the rewrite reads of TensorFlow's CollectiveAllReduceExtended: the number of workers."""

    def __init__(self, workers: int) -> None:
        self._num_workers = workers


def _distributed(workers: int, dataset):
    """The policy of the dataset TensorFlow's method receives once the rewrite has seen it."""
    received = []
    rewritten = hook_datasets._by_element_when_too_few_files(lambda self, dataset, options: received.append(dataset))
    rewritten(_Extended(workers), dataset, None)
    return received[0].options().experimental_distribute.auto_shard_policy


def test_fewer_files_than_workers_are_sharded_by_element_and_said_once(records, monkeypatch, capsys):
    monkeypatch.setattr(RUNTIME, "_said", set())
    one_file = tf.data.TFRecordDataset([records[0]]).batch(2)
    assert _distributed(2, one_file) == DATA
    assert _distributed(4, tf.data.TFRecordDataset(records)) == DATA  # 3 files for 4 workers
    said = capsys.readouterr().err.splitlines()
    assert said == ["tfstrategy: a dataset reads 1 file(s) for 2 workers, too few for TensorFlow's sharding by file: "
                    "each worker keeps its share of every batch instead (AutoShardPolicy.DATA, as TensorFlow's error "
                    "advises; set the dataset's experimental_distribute.auto_shard_policy to choose yourself)"]


def test_enough_files_one_worker_or_the_scripts_own_policy_are_left_alone(records, monkeypatch):
    monkeypatch.setattr(RUNTIME, "_said", set())
    assert _distributed(2, tf.data.TFRecordDataset(records)) == AUTO  # 3 files for 2 workers: by file
    assert _distributed(1, tf.data.TFRecordDataset([records[0]])) == AUTO
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    chosen = tf.data.TFRecordDataset([records[0]]).with_options(options)
    assert _distributed(2, chosen) == tf.data.experimental.AutoShardPolicy.FILE  # the script's choice stands


@pytest.mark.parametrize(("make", "workers", "said"), [
    pytest.param(lambda records: tf.data.TFRecordDataset(records), 2, "file", id="auto-by-file"),
    pytest.param(lambda records: _with_policy(tf.data.TFRecordDataset([records[0]]), "FILE"), 2, "file", id="file"),
    pytest.param(lambda records: _with_policy(tf.data.Dataset.range(8), "OFF"), 2, "off", id="off"),
    pytest.param(lambda records: tf.data.TFRecordDataset([records[0]]), 2, None, id="too-few-files-by-element"),
    pytest.param(lambda records: tf.data.Dataset.range(8).batch(2), 2, None, id="in-memory-by-element"),
    pytest.param(lambda records: tf.data.TFRecordDataset(records), 1, None, id="one-worker"),
])
def test_the_ledger_keeps_a_pipeline_whose_workers_read_data_of_their_own(records, monkeypatch, make, workers, said):
    """What an elastic job's launcher reads at a re-formation: by file or not sharded, a global batch depends on the
    number of workers."""

    class Keeper:
        sharding = None

    keeper = Keeper()
    monkeypatch.setattr(RUNTIME, "_said", set())
    monkeypatch.setattr(hook_datasets, "current_keeper", lambda: keeper)
    _distributed(workers, make(records))
    assert keeper.sharding == said


def _with_policy(dataset, name: str):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, name)
    return dataset.with_options(options)
