"""--executor ray over records with images: the chunk tasks (image decoding and the processor) run as Ray tasks and
the store has the local run's bytes, media files included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cli
from test_vision_inputs_store import args, single, store_bytes, world  # noqa: F401 (fixtures)

ray = pytest.importorskip("ray")
pytest.importorskip("packtool.formats.media")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_gives_the_local_bytes(world: dict[str, Path], single: Path, tmp_path: Path) -> None:  # noqa: F811
    code, _, err = cli(*args(world, tmp_path / "ray", "--executor", "ray", "--workers", "2"))
    assert code == 0, err
    assert store_bytes(tmp_path / "ray") == store_bytes(single)
