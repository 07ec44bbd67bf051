import sys
from pathlib import Path

# the benchmarks are scripts beside their own package (benchmarks/compare), not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
