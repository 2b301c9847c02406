"""Presentation: config snippets, figures and reports, from stored data only."""
