"""Placement and transport: who collects, who updates, what moves where.

A strategy never computes a loss; it builds the same trainer, algorithm and
collector as every other strategy and differs in where it places them and in the
``Sync`` it hands to the algorithm.
"""
