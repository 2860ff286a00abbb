"""Dense (no structured sparsity) peak tensor throughput of common NVIDIA GPUs, in
TFLOP/s, from NVIDIA's data sheets; for ``fraction_of_peak`` in ``lartpc bench model``.

``tf32`` is what float32 convolutions run at on Ampere and later, where PyTorch lets
cuDNN use TF32 by default (``torch.backends.cudnn.allow_tf32``); before Ampere, fp32.
Names are matched against ``torch.cuda.get_device_name`` in order, first match wins.
"""

from __future__ import annotations

#: (substring of the device name, {precision: TFLOP/s})
PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5 (HBM3)
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("V100", {"fp16": 125.0, "tf32": 15.7, "fp32": 15.7}),  # SXM2; no bf16, no TF32
    ("P100", {"fp16": 21.2, "tf32": 10.6, "fp32": 10.6}),  # SXM2, the paper's GPU
)


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Peak TFLOP/s of ``device_name`` at ``precision`` (bf16 | fp16 | tf32 | fp32), or
    None when the device or precision is not in the table (CPUs among them)."""
    for key, table in PEAKS:
        if key in device_name:
            return table.get(precision)
    return None
