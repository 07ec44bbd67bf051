import shutil
import sys
from pathlib import Path

import pytest

# the benchmarks are scripts beside their own package (benchmarks/compare), not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

#: the reported comparison's run records (read only)
REPORTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "shapes_cpu_750k" / "runs"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of three records of the reported comparison (read only from the repository)."""
    runs = tmp_path / "copy" / "runs"
    runs.mkdir(parents=True)
    for path in sorted(REPORTED.glob("*.json"))[:3]:
        shutil.copy(path, runs / path.name)
    return tmp_path / "copy"
