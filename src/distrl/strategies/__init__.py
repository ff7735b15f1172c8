"""Placement and transport: who collects, who updates, what moves where.

A strategy never computes a loss; it builds the same trainer, algorithm and
collector as every other strategy and differs in where it places them and in the
``Sync`` it hands to the algorithm. The engines live here too: the local launcher and torchrun
(``launch``), Ray (``ray_engine``), Monarch (``monarch_engine``) and Spark (``spark_engine``, and
``spark`` for ddp from a Spark driver).

Imports: :mod:`distrl.training` and everything below it; only the command line, the API and
:mod:`distrl.tune` import a strategy.
"""
