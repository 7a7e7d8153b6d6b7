"""Datasets and tasks."""
