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


def test_pytest_xdist_schedules_by_that_group(request: pytest.FixtureRequest):
    # the worker appends the group to the node id when it reads the mark; a mark added after
    # pytest-xdist's own collection hook ran was never read (conftest: tryfirst)
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on a pytest-xdist --dist loadgroup worker (tests/suite.py on 2+ cores)")
    assert request.node.nodeid.endswith(f"@{__name__}"), request.node.nodeid


@pytest.mark.gpu
def test_a_gpu_test_is_grouped_and_runs_only_with_cuda(request: pytest.FixtureRequest):
    # reached only where CUDA exists: elsewhere the same hook marks it skipped
    assert torch.cuda.is_available()
    assert request.node.get_closest_marker("xdist_group").args == (__name__,)
