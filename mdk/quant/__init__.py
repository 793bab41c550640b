"""Chip quantization (the contract: docs/pipeline.md). Import the submodules directly; this package stays import-light.

- ``layers``: ChipConv, the one chip layer;  ``modes``: apply_mode, what a stage switches on
- ``chips``: the chip table (CHIP_BITS, chip_bits) and the ``chip`` / ``export`` checks
- ``rounding``, ``weights``, ``activation``: R, the weight mantissas and shift, the 5-bit activation
- ``calibrate``, ``cal_stats``: the calibration methods and their statistics (the
  ``step.calibration`` node that names one: mdk/calibration_config.py, above the config groups)
- ``bn_fold``: fold_bn;  ``fusion``: fuse_gains;  ``bit_plan``: mask widths under a memory budget
- ``chip_model``, ``export``, ``integer_ref``: the integer model, its files, its exactness check
- ``gti_sdk``, ``gti_converter``: the GTI SDK hand-off and where the GTI converter would differ
"""
