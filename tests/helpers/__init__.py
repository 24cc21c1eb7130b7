"""What the tests share besides fixtures: calls, waits, doubles and processes (fixtures live in
tests/conftest.py). Never a test module: nothing here is collected, and no test module imports another."""
