"""Offline scoring: profiles, stage scores, judges, error codes, auditor, grader metrics, reports.

Depends on ``schemas``, ``replay`` and ``tasks``; never on ``recorder``.
"""
