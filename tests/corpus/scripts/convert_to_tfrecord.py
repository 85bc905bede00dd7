"""The converter tfrecord_pipeline.py starts as a subprocess (not a corpus entry of its own).

Shaped like TensorFlow's tutorial "TFRecord and tf.train.Example" (tensorflow/docs,
site/en/tutorials/load_data/tfrecord.ipynb): each example is a tf.train.Example of float_list
and int64_list features, serialized and written with tf.io.TFRecordWriter. It writes to a
temporary name and renames, so a reader never sees half a file.
"""

import os
import sys

import numpy as np
import tensorflow as tf


def serialize_example(feature, label):
    example = tf.train.Example(features=tf.train.Features(feature={
        "feature": tf.train.Feature(float_list=tf.train.FloatList(value=feature)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }))
    return example.SerializeToString()


def main(path, count):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(count, 10)).astype(np.float32)
    labels = (features.sum(axis=1) > 0).astype(np.int64)
    partial = f"{path}.{os.getpid()}.partial"
    with tf.io.TFRecordWriter(partial) as writer:
        for feature, label in zip(features, labels):
            writer.write(serialize_example(feature, int(label)))
    os.replace(partial, path)
    print(f"converter wrote {count} examples to {path} (tensorflow {tf.__version__})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
