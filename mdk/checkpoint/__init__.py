"""Checkpoints: files written whole or not at all and read without running code (``atomic``,
``files``: floor 1, used by every writer), a stage's folder and where it starts (``layout``), what
a checkpoint means (``meaning``), and models from saved files (``saved_models``)."""
