"""Tests of the benchmark scripts (quick CPU runs); part of the project's test command."""
