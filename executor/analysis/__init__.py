"""Torch-free analysis of measured runs (calibration, measured vs predicted); the app imports it."""
