"""tests/suite.py runs the tests on pytest-xdist workers with ``--dist loadgroup``: conftest's one
collection hook must give every test its module's group (module fixtures made once; a second hook
of the same name once replaced it silently, and every test ran ungrouped) and still skip the GPU
tests where CUDA is missing."""
from __future__ import annotations

import pytest
import torch


def test_a_test_is_in_its_module_s_xdist_group(request: pytest.FixtureRequest):
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == (__name__,)


@pytest.mark.gpu
def test_a_gpu_test_is_grouped_and_runs_only_with_cuda(request: pytest.FixtureRequest):
    # reached only where CUDA exists: elsewhere the same hook marks it skipped
    assert torch.cuda.is_available()
    assert request.node.get_closest_marker("xdist_group").args == (__name__,)
