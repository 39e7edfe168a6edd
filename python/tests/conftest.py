"""Shared by the Python tests: `@pytest.mark.python_recorder` runs a test's
drop-only budgets on the Python recorder (REMAT_TORCH_NATIVE=0), for what
only that recorder does or shows (its debug figures, its dispatch mode, its
interrupt points, compiled modules run eagerly)."""
import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "python_recorder: the test's drop-only budgets record in Python "
        "(REMAT_TORCH_NATIVE=0), as offloading ones do")


@pytest.fixture(autouse=True)
def _recorder_asked(request, monkeypatch):
    if request.node.get_closest_marker("python_recorder") is not None:
        monkeypatch.setenv("REMAT_TORCH_NATIVE", "0")
