"""Tests of the research studies (quick CPU runs); part of the project's test command."""
