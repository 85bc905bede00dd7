"""Shaped like TensorFlow's tutorial "Basic text classification" (tensorflow/docs,
site/en/tutorials/keras/text_classification.ipynb), distributed with MirroredStrategy() the way
users do it: the reviews are read with text_dataset_from_directory (train with a 0.2 validation
split and seed 42, test), a TextVectorization layer with a custom_standardization function is
adapted on the text-only training dataset and mapped over the datasets (cache, prefetch), all
before the strategy exists; then the Embedding/Dropout/GlobalAveragePooling1D/Dense(sigmoid)
model is built and compiled in the strategy's scope, fit with validation data and evaluated; and
the tutorial's export model, Sequential([vectorize_layer, model, Activation('sigmoid')]), built
after training outside any scope, is compiled, evaluated on the raw string dataset and asked to
predict three raw sentences.

Changed: the IMDB archive is replaced by 160 short synthetic reviews written as
pos/neg/*.txt files under ./data (as the archive unpacks), max_features 200 and sequence_length 20,
2 epochs instead of 10.
"""

import os
import re
import string

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers, losses

tf.keras.utils.set_random_seed(42)

# The aclImdb layout: <split>/{neg,pos}/<id>_<stars>.txt
rng = np.random.default_rng(0)
good, bad, filler = ["great", "wonderful", "loved"], ["terrible", "boring", "awful"], ["the", "movie", "was", "plot", "actor"]
for split, count in (("train", 128), ("test", 32)):
    for label, words in (("pos", good), ("neg", bad)):
        os.makedirs(os.path.join("data", "aclImdb", split, label), exist_ok=True)
        for i in range(count // 2):
            text = " ".join(rng.choice(filler + words, size=12)) + "<br />" + "!"
            path = os.path.join("data", "aclImdb", split, label, f"{i}_7.txt")
            with open(f"{path}.{os.getpid()}.part", "w") as f:  # whole files only, as an unpacked archive
                f.write(text.capitalize())
            os.replace(f"{path}.{os.getpid()}.part", path)
train_dir = os.path.join("data", "aclImdb", "train")
test_dir = os.path.join("data", "aclImdb", "test")

batch_size = 32
seed = 42
raw_train_ds = tf.keras.utils.text_dataset_from_directory(
    train_dir, batch_size=batch_size, validation_split=0.2, subset="training", seed=seed)
raw_val_ds = tf.keras.utils.text_dataset_from_directory(
    train_dir, batch_size=batch_size, validation_split=0.2, subset="validation", seed=seed)
raw_test_ds = tf.keras.utils.text_dataset_from_directory(test_dir, batch_size=batch_size)


def custom_standardization(input_data):
    lowercase = tf.strings.lower(input_data)
    stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
    return tf.strings.regex_replace(stripped_html, f"[{re.escape(string.punctuation)}]", "")


max_features = 200
sequence_length = 20
vectorize_layer = layers.TextVectorization(
    standardize=custom_standardization, max_tokens=max_features, output_mode="int",
    output_sequence_length=sequence_length)
train_text = raw_train_ds.map(lambda x, y: x)
vectorize_layer.adapt(train_text)


def vectorize_text(text, label):
    text = tf.expand_dims(text, -1)
    return vectorize_layer(text), label


AUTOTUNE = tf.data.AUTOTUNE
train_ds = raw_train_ds.map(vectorize_text).cache().prefetch(buffer_size=AUTOTUNE)
val_ds = raw_val_ds.map(vectorize_text).cache().prefetch(buffer_size=AUTOTUNE)
test_ds = raw_test_ds.map(vectorize_text).cache().prefetch(buffer_size=AUTOTUNE)

strategy = tf.distribute.MirroredStrategy()
embedding_dim = 16
with strategy.scope():
    model = tf.keras.Sequential([
        layers.Embedding(max_features, embedding_dim),
        layers.Dropout(0.2),
        layers.GlobalAveragePooling1D(),
        layers.Dropout(0.2),
        layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(loss=losses.BinaryCrossentropy(), optimizer="adam",
                  metrics=[tf.metrics.BinaryAccuracy(threshold=0.5)])

history = model.fit(train_ds, validation_data=val_ds, epochs=2, verbose=2)
loss, accuracy = model.evaluate(test_ds, verbose=2)
print("Loss: ", loss)
print("Accuracy: ", accuracy)

export_model = tf.keras.Sequential([vectorize_layer, model, layers.Activation("sigmoid")])
export_model.compile(loss=losses.BinaryCrossentropy(from_logits=False), optimizer="adam", metrics=["accuracy"])
metrics = export_model.evaluate(raw_test_ds, return_dict=True, verbose=2)
print(metrics)
examples = tf.constant(["The movie was great!", "The movie was okay.", "The movie was terrible..."])
print(export_model.predict(examples, verbose=0).ravel())

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
