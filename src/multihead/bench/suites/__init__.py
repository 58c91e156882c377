"""The suites. Each module has `run(ctx, sizes) -> SuiteResult` and its own `Sizes` presets."""
