"""Shaped like a model zoo's two-stage data preparation (TF Model Garden runs a converter such as
official/nlp/data/create_finetuning_data.py before its trainer) with the reading side of
TensorFlow's tutorial "TFRecord and tf.train.Example" (tensorflow/docs,
site/en/tutorials/load_data/tfrecord.ipynb): the training script starts a Python subprocess, the
converter convert_to_tfrecord.py (which imports TensorFlow itself), to write ./data/train.tfrecord;
then it parses the records with tf.io.parse_single_example into a TFRecordDataset, trains a
Keras model in MirroredStrategy()'s scope with a fixed global batch and evaluates it.

Changed: the converter writes 256 synthetic examples of 10 floats and a binary label.
"""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(31)

os.makedirs("data", exist_ok=True)
record_path = os.path.join("data", "train.tfrecord")
converter = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_to_tfrecord.py")
subprocess.run([sys.executable, converter, record_path, "256"], check=True)

feature_description = {
    "feature": tf.io.FixedLenFeature([10], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def _parse_function(example_proto):
    parsed = tf.io.parse_single_example(example_proto, feature_description)
    return parsed["feature"], parsed["label"]


strategy = tf.distribute.MirroredStrategy()
dataset = tf.data.TFRecordDataset([record_path]).map(_parse_function).batch(32)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), metrics=["accuracy"])

history = model.fit(dataset, epochs=3, verbose=2)
print("evaluate", model.evaluate(dataset, verbose=0))
weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
