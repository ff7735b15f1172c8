"""Knock-out Nim (:class:`distrl_aecgames.Knockout`), three players by default."""

from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from distrl_aecgames import Knockout


def env(**kwargs):
    return OrderEnforcingWrapper(Knockout(**kwargs))
