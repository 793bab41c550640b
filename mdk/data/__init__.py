"""Datasets: each format is a reader of standard records; everything after it is format-free.

- :mod:`mdk.data.records`: ``Record`` (one image and its boxes) and the ``Reader`` interface.
- :mod:`mdk.data.voc`: Pascal VOC annotation XML / split parsing and ``VOCReader``.
- :mod:`mdk.data.coco`: ``COCOReader`` (instances JSON); :mod:`mdk.data.coco_export`: records
  (e.g. a VOC folder's) -> COCO JSON (``python -m mdk.tools.voc2coco``).
- :mod:`mdk.data.shapes`: the built-in generated dataset (``ensure_shapes_dataset``, VOC layout);
  :mod:`mdk.data.shapes_hard`: its harder 15-class variant (``dataset=shapes_hard``);
  :mod:`mdk.data.generated`: how both are written (manifest, regeneration, staging).
- :mod:`mdk.data.config`: the ``dataset`` group's schema, word lists and ``check``.
- :mod:`mdk.data.index`: the records cache (one meta txt per split), for any reader
  (``python -m mdk.tools.xml2txt`` is its command-line front end for VOC).
- :mod:`mdk.data.dataset`: ``DetectionDataset`` over records (images, YOLO targets,
  split-invariant augmentation).
- :mod:`mdk.data.build`: ``build_datasets(cfg.dataset, ...)`` and the pre-flight
  ``check_dataset_files`` for the ``dataset`` config group.
- :mod:`mdk.data.image_check`: every image decoded once (cached) so bad files are found before
  training; ``dataset.on_bad_image=error|skip``.
- :mod:`mdk.data.loader`: ``SafeLoader``, a DataLoader whose worker errors end the run at once
  as the same one-line error.

Kept import-free so ``import mdk.data.voc`` stays cheap (no torch).
"""
