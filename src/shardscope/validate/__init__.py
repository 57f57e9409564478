"""Validation against published measured runs (CSV rows → predicted vs measured)."""
