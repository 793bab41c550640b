"""A slow loop transcription of the VOC devkit (VOCevaldet.m + VOCap.m as documented) for one
class: the reference the vectorised evaluator is tested against."""
from __future__ import annotations

import math

import numpy as np


def devkit_ap(dets, gts, cls, metric, off, thr=0.5):
    """One class, transcribed loop by loop (MATLAB's NaN-ignoring max kept)."""
    npos = sum(int(not d) for boxes, labels, diff in gts.values()
               for lab, d in zip(labels, diff) if lab == cls)
    rows = [(i, b, s) for i in sorted(dets) for b, s, lab in
            zip(dets[i]["boxes"], dets[i]["scores"], dets[i]["labels"]) if lab == cls]
    rows = sorted(rows, key=lambda r: -r[2])  # Python's sort is stable, like MATLAB's
    taken = {i: [False] * len(gts[i][0]) for i in gts}
    tp, fp = [0] * len(rows), [0] * len(rows)
    for d, (i, bb, _) in enumerate(rows):
        boxes, labels, diff = gts[i]
        ovmax, jmax = -math.inf, -1
        for j, (bg, lab) in enumerate(zip(boxes, labels)):
            if lab != cls:
                continue
            iw = min(bb[2], bg[2]) - max(bb[0], bg[0]) + off
            ih = min(bb[3], bg[3]) - max(bb[1], bg[1]) + off
            if iw > 0 and ih > 0:
                ua = ((bb[2] - bb[0] + off) * (bb[3] - bb[1] + off)
                      + (bg[2] - bg[0] + off) * (bg[3] - bg[1] + off) - iw * ih)
                ov = iw * ih / ua
                if ov > ovmax:
                    ovmax, jmax = ov, j
        if ovmax >= thr:
            if not diff[jmax]:
                if not taken[i][jmax]:
                    tp[d], taken[i][jmax] = 1, True
                else:
                    fp[d] = 1
        else:
            fp[d] = 1
    if npos == 0:
        return math.nan
    tp, fp = np.cumsum(tp, dtype=float), np.cumsum(fp, dtype=float)
    rec = tp / npos
    with np.errstate(invalid="ignore"):
        prec = tp / (fp + tp)                     # 0/0 = NaN where only ignored rows so far
    if metric == "voc07":
        ap = 0.0
        for t in [k * 0.1 for k in range(11)]:   # the ports' np.arange(0.0, 1.1, 0.1)
            sel = prec[rec >= t]
            sel = sel[~np.isnan(sel)]
            ap += (sel.max() if len(sel) else 0.0) / 11
        return ap
    mrec = np.concatenate([[0.0], rec, [1.0]])
    mpre = np.concatenate([[0.0], prec, [0.0]])
    for k in range(len(mpre) - 2, -1, -1):
        mpre[k] = np.fmax(mpre[k], mpre[k + 1])   # MATLAB max ignores NaN
    idx = [k for k in range(1, len(mrec)) if mrec[k] != mrec[k - 1]]
    return float(sum((mrec[k] - mrec[k - 1]) * mpre[k] for k in idx))
