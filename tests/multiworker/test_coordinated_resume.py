"""Resuming from a coordinated backup in one process on 2 replicas: fit mid-epoch (save_freq=N) and a custom loop.

The collective agreement between workers, and kills, are in test_coordinated_faults.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import mirrored
from tfstrategy import backup_callbacks, make_train_step

STEPS, EPOCHS, BATCH = 8, 3, 16


class Interrupt(Exception):
    pass


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    return x, (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")


def build(strategy, *, random_layers=False):
    import keras

    keras.utils.set_random_seed(3)
    noise = [keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.1)] if random_layers else []
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), *noise,
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def fit(backup_dir=None, *, stop_at=None):
    import keras
    import tensorflow as tf

    strategy = mirrored(2)
    model = build(strategy)

    class StopAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == stop_at:
                raise Interrupt

    callbacks = backup_callbacks(backup_dir, save_freq=3) if backup_dir else []
    x, y = data()
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=EPOCHS,
                        callbacks=[*callbacks, StopAt()], shuffle=False, verbose=0)
    return model, history, callbacks


@pytest.mark.slow
def test_fit_resumes_mid_epoch_from_the_last_committed_batch_to_the_uninterrupted_weights(tmp_path):
    reference, _, _ = fit()
    with pytest.raises(Interrupt):
        fit(tmp_path, stop_at=(1, 5))  # commits at batches 3 and 6 of each epoch: the last is epoch 1 batch 3
    resumed, history, callbacks = fit(tmp_path)
    assert callbacks[0].resumed.step == STEPS + 3
    assert (callbacks[0].resumed.epoch, callbacks[0].resumed.batch) == (1, 3)
    assert len(history.history["loss"]) == 2  # epochs 2 and 3: the first 3 batches of epoch 2 were skipped
    assert int(resumed.optimizer.iterations.numpy()) == STEPS * EPOCHS
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not (tmp_path / "worker-0" / "commit.json").exists()  # removed once fit completed


def loop(backup_dir=None, *, stop_at=None):
    import keras
    import tensorflow as tf

    strategy = mirrored(2)
    model = build(strategy)
    step = make_train_step(model, strategy=strategy, global_batch=BATCH, loss=keras.losses.MeanSquaredError(reduction="none"))
    backup = step.backup(backup_dir, save_freq=3)
    start = backup.restore()
    x, y = data()
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))
    for epoch in range(start.epoch, EPOCHS):
        for batch, item in enumerate(dataset):
            if (epoch, batch) == stop_at:
                raise Interrupt
            if start.done(epoch, batch):
                continue
            step(item)
            backup.batch_done(epoch, batch)
        backup.epoch_done(epoch)
    backup.finish()
    return model, start


@pytest.mark.slow
def test_a_custom_loop_resumes_from_the_last_committed_step_to_the_uninterrupted_weights(tmp_path):
    reference, start = loop()
    assert start.step == 0
    with pytest.raises(Interrupt):
        loop(tmp_path, stop_at=(2, 2))
    resumed, start = loop(tmp_path)
    # commits after batches 3 and 6 of each epoch; stopped in epoch 3 before its third: the last is epoch 2 batch 6
    assert (start.step, start.epoch, start.batch) == (STEPS + 6, 1, 6)
    assert int(resumed.optimizer.iterations.numpy()) == STEPS * EPOCHS
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_custom_loop_backup_needs_the_model_compiled_with_its_optimizer(tmp_path):
    import keras

    from tfstrategy.errors import TrainingError

    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)
    step = make_train_step(model, strategy=strategy, global_batch=BATCH, loss=keras.losses.MeanSquaredError(reduction="none"), optimizer=optimizer)
    with pytest.raises(TrainingError, match=r"Call model.compile\(optimizer=optimizer\)"):
        step.backup(tmp_path)
    assert not step.backup(None).enabled


# --- refusals in one process (the same code path every worker runs) ---------------------------


def _backup(tmp_path, model, **env):
    from tfstrategy.multiworker.coordinated import CoordinatedBackup

    return CoordinatedBackup(tmp_path, mirrored(2), env={"TFSTRATEGY_JOB_ID": "job-a", **env})


def test_a_seeded_record_claiming_a_step_without_parts_trains_nothing_and_names_the_file(tmp_path):
    from tfstrategy.errors import BackupError
    from tfstrategy.multiworker import commit

    model = build(mirrored(2))
    (tmp_path / "worker-0").mkdir(mode=0o700)
    commit.write_record(tmp_path / "worker-0", commit.CommitRecord(job_id="job-a", workers=1, steps=(100,)))
    with pytest.raises(BackupError) as error:
        _backup(tmp_path, model).restore(model)
    assert "Steps 100 were committed, but no step can be loaded by every worker" in str(error.value)
    assert f"step 100: {tmp_path}/worker-0/step-100.json is missing" in str(error.value)


def test_an_unparsable_record_with_no_other_is_an_error_not_a_fresh_start(tmp_path):
    from tfstrategy.errors import BackupError

    model = build(mirrored(2))
    (tmp_path / "worker-0").mkdir(mode=0o700)
    (tmp_path / "worker-0" / "commit.json").write_text("{")
    with pytest.raises(BackupError, match=rf"cannot be read and no other worker has one.*{tmp_path}/worker-0/commit.json"):
        _backup(tmp_path, model).restore(model)


def test_a_record_of_another_job_is_refused_and_a_saved_step_resumes(tmp_path):
    from tfstrategy.errors import BackupError

    model = build(mirrored(2))
    saver = _backup(tmp_path, model)
    assert saver.restore(model).step == 0
    with mirrored(2).scope():
        model.optimizer.build(model.trainable_variables)
    assert saver.save(model, epoch=1, batch=0)
    saver.close()
    with pytest.raises(BackupError, match=r"commit.json belongs to job 'job-a', not this job 'job-b' \(from TFSTRATEGY_JOB_ID\)"):
        _backup(tmp_path, model, TFSTRATEGY_JOB_ID="job-b").restore(model)
    from tfstrategy.multiworker.coordinated import ResumePoint

    assert _backup(tmp_path, model).restore(model) == ResumePoint(step=0, epoch=1, batch=0)


def test_the_backup_keeps_the_seed_generators_so_a_resumed_model_draws_on_not_again(tmp_path):
    """Keras 3's ``save_weights`` leaves out the random layers' seed generators (their state is no weight): loaded
    alone, a model draws its first Dropout masks and noise again. The backup keeps their state (in the step's
    sidecar), so the resumed model's next draw is the one the uninterrupted model makes."""
    from tfstrategy import _compat
    from tfstrategy.multiworker import commit

    strategy = mirrored(2)
    model = build(strategy, random_layers=True)
    x = data()[0][:BATCH]
    for _ in range(3):
        model(x, training=True)  # three steps' draws
    saver = _backup(tmp_path, model)
    assert saver.restore(model).step == 0
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    assert saver.save(model, epoch=0, batch=3)
    saver.close()
    saved = [list(state.numpy()) for state in _compat.model_seed_states(model)]
    assert [state[1] for state in saved] == [3, 3]  # Dropout's and GaussianNoise's, after three draws
    assert commit.read_part(tmp_path / "worker-0", 0).seeds == tuple(tuple(state) for state in saved)
    uninterrupted = model(x, training=True).numpy()

    resumed = build(mirrored(2), random_layers=True)
    _backup(tmp_path, resumed).restore(resumed)
    assert [list(state.numpy()) for state in _compat.model_seed_states(resumed)] == saved
    np.testing.assert_array_equal(resumed(x, training=True).numpy(), uninterrupted)


def test_a_damaged_newest_step_falls_back_one_step_and_is_voided(tmp_path, capfd):
    from tfstrategy.multiworker import commit
    from tfstrategy.multiworker.coordinated import ResumePoint

    strategy = mirrored(2)
    model = build(strategy)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    saver = _backup(tmp_path, model)
    saver.restore(model)
    for step in (8, 16):
        model.optimizer.iterations.assign(step)
        assert saver.save(model, epoch=step // 8, batch=0)
    saver.close()
    part = tmp_path / "worker-0" / "step-16.weights.h5"
    part.write_bytes(part.read_bytes()[:100])
    assert _backup(tmp_path, model).restore(model) == ResumePoint(step=8, epoch=1, batch=0)
    assert f"worker-0 does not resume from committed step 16: {part} (step 16) has 100 bytes" in capfd.readouterr().err
    assert not part.exists() and commit.read_record(tmp_path / "worker-0" / "commit.json").steps == (8,)


def test_every_training_task_has_its_own_rank_in_the_agreement_also_with_a_chief(tmp_path):
    import json

    from tfstrategy.multiworker.coordinated import CoordinatedBackup

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    ranks = {}
    for kind, index in (("chief", 0), ("worker", 0), ("worker", 1)):
        env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})}
        backup = CoordinatedBackup(tmp_path, None, env=env)
        ranks[backup.task] = (backup.index, backup.num_workers)
    assert ranks == {"chief-0": (0, 3), "worker-0": (1, 3), "worker-1": (2, 3)}
