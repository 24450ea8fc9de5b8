"""The learned model: vocabulary, embeddings, Siamese encoders, calibration, bundle, training."""
