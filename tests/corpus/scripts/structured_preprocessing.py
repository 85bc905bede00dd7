"""Shaped like TensorFlow's tutorial "Classify structured data using Keras preprocessing layers"
(tensorflow/docs, site/en/tutorials/structured_data/preprocessing_layers.ipynb), with the
preprocessing layers created and adapted inside MirroredStrategy()'s scope as TensorFlow's
distributed-input guide advises: df_to_dataset (a dict of columns, shuffled, batched),
get_normalization_layer (Normalization adapted on one feature), get_category_encoding_layer
(StringLookup / IntegerLookup with max_tokens, adapted, then CategoryEncoding with num_tokens),
all_inputs/encoded_features concatenated into a small functional model with Dropout, compiled
with Adam and BinaryCrossentropy(from_logits=True), fit, evaluate, and predict on one raw sample.

Changed: the PetFinder CSV becomes 320 synthetic rows of the same column kinds (numeric Age and
Fee, integer-coded PhotoAmt, string Type and Color1) and a binary target; 3 epochs.
"""

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(37)

rng = np.random.default_rng(0)
n = 320
dataframe = {
    "Age": rng.integers(1, 60, n).astype("int64"),
    "Fee": rng.integers(0, 200, n).astype("int64"),
    "PhotoAmt": rng.integers(0, 10, n).astype("int64"),
    "Type": rng.choice(["Cat", "Dog"], n),
    "Color1": rng.choice(["Black", "Brown", "Golden", "White", "Gray"], n),
}
target = ((dataframe["Age"] < 20) | (dataframe["Type"] == "Dog")).astype("int64")
split = 256
train = {key: value[:split] for key, value in dataframe.items()}
val = {key: value[split:] for key, value in dataframe.items()}


def df_to_dataset(columns, labels, shuffle=True, batch_size=32):
    ds = tf.data.Dataset.from_tensor_slices(({key: value[:, None] for key, value in columns.items()}, labels))
    if shuffle:
        ds = ds.shuffle(buffer_size=len(labels), seed=3)
    return ds.batch(batch_size).prefetch(batch_size)


def get_normalization_layer(name, dataset):
    normalizer = tf.keras.layers.Normalization(axis=None)
    feature_ds = dataset.map(lambda x, y: x[name])
    normalizer.adapt(feature_ds)
    return normalizer


def get_category_encoding_layer(name, dataset, dtype, max_tokens=None):
    if dtype == "string":
        index = tf.keras.layers.StringLookup(max_tokens=max_tokens)
    else:
        index = tf.keras.layers.IntegerLookup(max_tokens=max_tokens)
    feature_ds = dataset.map(lambda x, y: x[name])
    index.adapt(feature_ds)
    encoder = tf.keras.layers.CategoryEncoding(num_tokens=index.vocabulary_size())
    return lambda feature: encoder(index(feature))


strategy = tf.distribute.MirroredStrategy()
batch_size = 64
train_ds = df_to_dataset(train, target[:split], batch_size=batch_size)
val_ds = df_to_dataset(val, target[split:], shuffle=False, batch_size=batch_size)

with strategy.scope():
    all_inputs, encoded_features = [], []
    for header in ["PhotoAmt", "Fee"]:
        numeric_col = tf.keras.Input(shape=(1,), name=header)
        normalization_layer = get_normalization_layer(header, train_ds)
        all_inputs.append(numeric_col)
        encoded_features.append(normalization_layer(numeric_col))
    age_col = tf.keras.Input(shape=(1,), name="Age", dtype="int64")
    encoding_layer = get_category_encoding_layer(name="Age", dataset=train_ds, dtype="int64", max_tokens=5)
    all_inputs.append(age_col)
    encoded_features.append(encoding_layer(age_col))
    for header in ["Type", "Color1"]:
        categorical_col = tf.keras.Input(shape=(1,), name=header, dtype="string")
        encoding_layer = get_category_encoding_layer(name=header, dataset=train_ds, dtype="string", max_tokens=5)
        all_inputs.append(categorical_col)
        encoded_features.append(encoding_layer(categorical_col))

    all_features = tf.keras.layers.concatenate(encoded_features)
    x = tf.keras.layers.Dense(16, activation="relu")(all_features)
    x = tf.keras.layers.Dropout(0.5)(x)
    output = tf.keras.layers.Dense(1)(x)
    model = tf.keras.Model(all_inputs, output)
    model.compile(optimizer="adam", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True), metrics=["accuracy"])

history = model.fit(train_ds, epochs=3, validation_data=val_ds, verbose=2)
loss, accuracy = model.evaluate(val_ds, verbose=2)
print("Accuracy", accuracy)
sample = {"Type": "Cat", "Age": 3, "Color1": "Black", "PhotoAmt": 2, "Fee": 100}
input_dict = {name: tf.convert_to_tensor([[value]]) for name, value in sample.items()}
predictions = model.predict(input_dict, verbose=0)
print(f"This particular pet had a {100 * float(tf.nn.sigmoid(predictions[0][0])):.1f} percent probability of being adopted.")
weights = sum(float(np.abs(np.asarray(w, dtype="float64")).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
