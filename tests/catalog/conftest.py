import pytest

from simstore.catalog import Catalog


@pytest.fixture
def cat(tmp_path):
    return Catalog.init(str(tmp_path / "store"))
