"""What several test files share: the environment the suite runs in, shims and workers to test
against, and the differential, fault-injection and fuzzing harnesses."""
