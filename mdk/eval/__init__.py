"""Detection evaluation: the metrics (metrics.py: VOC devkit AP in voc_ap.py, COCO-rule AP in
coco_ap.py), exact evaluation under DDP (distributed.py), flat scalars and tables of a result
(scalars.py), and reports (PR curves in plots.py, detection grids in grid.py)."""
