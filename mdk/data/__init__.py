"""Datasets: each format is a reader of standard records; everything after it is format-free.

- :mod:`mdk.data.records`: ``Record`` (one image and its boxes) and the ``Reader`` interface.
- :mod:`mdk.data.voc`, :mod:`mdk.data.coco`: the readers; :mod:`mdk.data.coco_export`: records
  -> COCO JSON.
- :mod:`mdk.data.shapes`, :mod:`mdk.data.shapes_hard`: the built-in generated datasets;
  :mod:`mdk.data.generated`: how both are written.
- :mod:`mdk.data.config`: the ``dataset`` group's schema and ``check``.
- :mod:`mdk.data.index`: the records cache (one meta txt per split).
- :mod:`mdk.data.dataset`: ``DetectionDataset`` over records (images, targets, augmentation).
- :mod:`mdk.data.build`: ``build_datasets`` and the pre-flight ``check_dataset_files``.
- :mod:`mdk.data.image_check`: every image decoded once (cached) before training.
- :mod:`mdk.data.loader`: ``SafeLoader``, whose worker errors end the run at once, as one line.
"""
