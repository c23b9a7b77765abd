import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _tmp_prep  # noqa: E402
from s3server import S3Server  # noqa: E402


def make_prepared(root, clips=12, seed=0):
    return _tmp_prep.make(root, clips)


@pytest.fixture(scope="session")
def s3():
    server = S3Server()
    yield server
    server.stop()
