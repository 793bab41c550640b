"""Checkpoints: files read without running code (``files``: floor 1; they are written whole or
not at all through mdk/atomic_file.py, the one replace every writer uses), a stage's folder and
where it starts (``layout``), what a checkpoint means (``meaning``), and the one way from a weights
file of any kind to a model (``weights_file``)."""
