"""What every test sees: the time cap plugin (tests/timecap.py) and pytester.

Nothing here needs a database: the database fixtures are in tests/database.py, and the
conftest.py of each folder whose tests use them (integration, system, repository)
imports them, so tests/unit runs with no server at all.
"""

# Every async test runs under a time cap (tests/timecap.py); pytester tests that cap.
pytest_plugins = ("tests.timecap", "pytester")
