"""pytest plugin for `cargo xtask compat`: applies tools/compat-exclusions.md to
llama.cpp's server tests and records every test's outcome.

- An excluded test (its node id starts with a pattern of the exclusions table) is not
  run: it is marked skipped with the reason `pinch-excluded: ...`, and recorded as
  `excluded`, never as passed.
- Each test's outcome goes to `$PINCH_COMPAT_RESULTS` as one line
  `outcome<TAB>nodeid<TAB>detail` (outcome: passed, failed, skipped, excluded), which
  the xtask turns into the table per file.
"""
import os
import re

import pytest

_RESULTS = os.environ.get("PINCH_COMPAT_RESULTS")
_EXCLUSIONS = os.environ.get("PINCH_COMPAT_EXCLUSIONS")
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|")


def _load():
    rules = []
    if not _EXCLUSIONS:
        return rules
    with open(_EXCLUSIONS, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## Known failures"):
                break  # those run (the xtask reads that table)
            m = _ROW.match(line)
            if m:
                rules.append((m.group(1), m.group(2)))
    return rules


_RULES = _load()


def excluded(nodeid):
    """The reason `nodeid` is excluded, or None. Node ids look like
    `unit/test_basic.py::test_no_ui`; patterns are written without `unit/`."""
    short = nodeid.split("/", 1)[1] if nodeid.startswith("unit/") else nodeid
    for pattern, why in _RULES:
        if short == pattern or short.startswith(pattern + "[") or (
            pattern.endswith((".py", "[")) and short.startswith(pattern)
        ):
            return why
    return None


def _record(outcome, nodeid, detail=""):
    if not _RESULTS:
        return
    detail = detail.replace("\t", " ").replace("\n", " ")[:300]
    with open(_RESULTS, "a", encoding="utf-8") as f:
        f.write(f"{outcome}\t{nodeid}\t{detail}\n")


def pytest_collection_modifyitems(config, items):
    for item in items:
        why = excluded(item.nodeid)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason="pinch-excluded: " + why))


def pytest_runtest_logreport(report):
    if report.when == "setup" and report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if "pinch-excluded: " in reason:
            _record("excluded", report.nodeid, reason.split("pinch-excluded: ", 1)[1])
        else:
            _record("skipped", report.nodeid, reason)
    elif report.when == "setup" and report.failed:
        _record("failed", report.nodeid, "setup: " + str(report.longrepr)[-300:])
    elif report.when == "call":
        if report.passed:
            _record("passed", report.nodeid)
        elif report.skipped:
            _record("skipped", report.nodeid, str(report.longrepr)[-300:])
        else:
            msg = getattr(report.longrepr, "reprcrash", None)
            _record("failed", report.nodeid, msg.message if msg else str(report.longrepr)[-300:])
