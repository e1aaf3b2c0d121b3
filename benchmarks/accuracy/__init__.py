"""Accuracy at reduced CPU budgets on real data: every registered method side by side."""
