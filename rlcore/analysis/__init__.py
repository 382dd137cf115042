"""Reads finished run directories only: tables, paired statistics and figures."""
