//! Golden tests live in tests/tests/.
