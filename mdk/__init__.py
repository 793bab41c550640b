"""mdk: a Hydra-composed runner taking GNetDet detectors through chip quantization stages.

Importing the package is cheap on purpose (no torch import here): `run.py --help` and the
bootstrapper must start fast.
"""

__version__ = "0.1.0"
