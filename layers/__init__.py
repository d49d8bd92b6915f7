"""Reusable building blocks shared by the forecasting models."""
