import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "training_public.csv"


@pytest.fixture(scope="session")
def public_csv() -> Path:
    if not SHARED.is_file():
        pytest.skip("shared/validation/training_public.csv not present")
    return SHARED
