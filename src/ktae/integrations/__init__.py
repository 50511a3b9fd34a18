"""Adapters that run ktae's estimators and losses inside other training engines.

Each adapter depends on the core (:mod:`ktae.core`), never the reverse, and imports its
engine only when used.
"""
