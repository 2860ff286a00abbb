"""The published numbers of Hagen et al. 2020, as data.

Used by the report to stand our results beside the paper's. Accuracies are fractions;
confusion matrices are row-normalised percent, rows true, columns predicted, in
:data:`lartpc.analysis.runs.CLASSES` order (gamma, electron, muon, pion, kaon).
"""

from __future__ import annotations

SOURCE = ("Hagen et al. 2020, dense vs sparse CNN training on SummitDev "
          "(P100 GPUs, minibatch 7 per GPU, 15000 training images, 4 h job limit)")

TTL_THRESHOLD = 1.2
MINIBATCH_PER_GPU = 7
TRAIN_EVENTS = 15000
TIME_LIMIT_S = 4 * 3600

PAPER: dict[str, dict] = {
    "jishnet": {
        "label": "JishNet (dense)",
        "gpu_counts": [32, 64, 128, 192],
        "epoch_rate_exponent": 0.9,
        "ttl_exponent": -0.7,
        "epoch_rate_per_min": {192: 1.5},
        "images_per_s_per_gpu": 2.3,
        "accuracy": 0.788,
        "accuracy_err": 0.038,
        "accuracy_gpus": 128,
        "confusion_percent": [
            [66.7, 33.0, 0.0, 0.0, 0.3],
            [1.6, 98.0, 0.0, 0.4, 0.0],
            [0.0, 0.1, 98.9, 0.0, 1.0],
            [1.6, 1.7, 1.3, 37.5, 57.8],
            [0.6, 0.1, 2.1, 26.3, 71.0],
        ],
        "remarks": "TTL sublinear, hypothesised to be caused by the data-loading time.",
    },
    "scnet": {
        "label": "SCNet (sparse)",
        "gpu_counts": [32, 64, 128],
        "epoch_rate_exponent": 0.9,
        "ttl_exponent": -0.6,
        "epoch_rate_per_min": {128: 2.5},
        "images_per_s_per_gpu": 4.9,
        "accuracy": 0.768,
        "accuracy_err": 0.033,
        "accuracy_gpus": 128,
        "confusion_percent": [
            [66.1, 33.2, 0.0, 0.7, 0.0],
            [0.9, 98.8, 0.0, 0.3, 0.0],
            [0.0, 0.0, 99.4, 0.0, 0.5],
            [0.0, 1.1, 1.0, 68.0, 29.9],
            [0.4, 0.4, 1.8, 67.1, 30.4],
        ],
        "remarks": "TTL about 4x lower than dense; little visible data-loading time.",
    },
}
