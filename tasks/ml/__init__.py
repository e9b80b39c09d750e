"""The ML pieces: model resolution, the sentence encoder, the student, PCA projection, metrics and STS."""
