"""From a plain loss to the gradients of the network's outputs.

Every algorithm writes its loss as a scalar function of what a network outputs (log-probs,
entropies, values, Q-values). The network takes the gradient from there to its parameters: the
closed-form MLPs by their backward passes, any other module by autograd. Between the two sits
one small autograd graph, the loss's own::

    log_prob, entropy, values = leaves(terms.log_prob, terms.entropy, fwd.values)
    loss = ppo_loss(log_prob, entropy, values, ...)
    agent.backward(fwd, terms, actions, *output_grads(loss, (log_prob, entropy, values)))

so that no gradient is derived by hand and a new loss term is one more line.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def leaves(*outputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Detached copies of network outputs that autograd tracks, as the inputs of a loss."""
    return tuple(output.detach().requires_grad_(True) for output in outputs)


def output_grads(loss: torch.Tensor, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """d(loss)/d(input) for each of ``inputs`` (from :func:`leaves`); None where the loss does not use one."""
    return torch.autograd.grad(loss, list(inputs), allow_unused=True)
