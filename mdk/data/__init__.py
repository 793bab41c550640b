"""Datasets in Pascal VOC layout.

- :mod:`mdk.data.voc`: annotation XML / split parsing and :class:`~mdk.data.voc.DataError`.
- :mod:`mdk.data.shapes`: the built-in generated dataset (``ensure_shapes_dataset``).
- :mod:`mdk.data.dataset`: ``DetectionDataset`` (images, YOLO targets, split-invariant augmentation).
- :mod:`mdk.data.build`: ``build_datasets(cfg.dataset, ...)`` for the ``dataset`` config group.
- :mod:`mdk.data.image_check`: every image decoded once (cached) so bad files are found before
  training; ``dataset.on_bad_image=error|skip``.
- :mod:`mdk.data.loader`: ``SafeLoader``, a DataLoader whose worker errors end the run at once
  as the same one-line error.
- :mod:`mdk.data.index`: the annotation -> meta txt index the loader reads through
  (``python -m mdk.tools.xml2txt`` is its command-line front end).

Kept import-free so ``import mdk.data.voc`` stays cheap (no torch).
"""
