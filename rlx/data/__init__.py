"""Prompt data (verl parquet rows or synthetic tasks) and rule-based rewards."""
