"""Datasets: each format is a reader of standard records (:mod:`mdk.data.records`; the readers
:mod:`mdk.data.voc` and :mod:`mdk.data.coco`); everything after it (the index cache, the image
check, the dataset, the loader) is format-free. :mod:`mdk.data.build` builds them from config.
"""
