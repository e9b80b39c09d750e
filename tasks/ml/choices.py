"""The named choices of the ML pieces, light enough for the stages' parameter models to import."""

from typing import Literal

Mode = Literal["uncentered", "centered"]  # PCA projection: HPD's uncentered, or classic centered
Init = Literal["ridge", "pca", "random"]  # the student's Dense head initialisation
Activation = Literal["tanh", "identity"]  # the student's Dense head activation
