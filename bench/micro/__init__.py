"""pytest-benchmark micro-benchmarks (issue 10, section 4): `nox -s bench` runs them and saves
bench/results/micro.json. Not in the test suite's testpaths: they time, they do not assert speed."""
