"""The benchmarks' integration tests (a package, so its conftest is not the product's module name)."""
