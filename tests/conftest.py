import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parents[1]
# The project's copy of the shared public rows, with the `flags` each run's sources state
# (tools/validation_flags.py), so a clone reproduces the README's tables without ../shared.
PUBLIC = ROOT / "validation" / "training_public.csv"
SHARED = ROOT.parent / "shared" / "validation" / "training_public.csv"


@pytest.fixture(scope="session")
def public_csv() -> Path:
    return PUBLIC


@pytest.fixture(scope="session")
def shared_csv() -> Path:
    """The team's file as published (blank `flags`): what a user's description alone gives."""
    if not SHARED.is_file():
        pytest.skip("../shared/validation/training_public.csv not present")
    return SHARED
