"""Adam and RMSProp over one flat parameter buffer, with global-norm clipping after the sync."""

from __future__ import annotations

import math

import torch

from distrl.nets import ParamBuffer

# torch's fused Adam kernel (what torch.optim.Adam(fused=True) calls), without the
# optimizer wrapper's per-step bookkeeping; the plain implementation is the fallback.
_FUSED_ADAM = getattr(torch, "_fused_adam_", None)


def linear(start: float, progress_remaining: float, schedule: str) -> float:
    """``start`` for a constant schedule; ``start * progress_remaining`` for a linear one."""
    return start * progress_remaining if schedule == "linear" else start


class ClippedAdam:
    """Adam (Kingma & Ba 2014, arXiv:1412.6980) on a :class:`ParamBuffer`.

    ``step`` takes the buffer's gradient summed over every worker's ``samples`` and steps on their mean: it
    scales the mean so that its global norm is at most ``max_grad_norm`` (as torch's ``clip_grad_norm_`` does)
    and applies the same update as ``torch.optim.Adam``, in a few element-wise operations over the single flat
    tensor. The division by ``samples`` rides on the clip coefficient rather than costing a pass of its own.
    """

    def __init__(
        self,
        params: ParamBuffer,
        lr: float,
        eps: float = 1e-5,
        max_grad_norm: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
    ):
        self.params = params
        self.lr = lr
        self.eps = eps
        self.max_grad_norm = max_grad_norm
        self.beta1, self.beta2 = betas
        self.exp_avg = torch.zeros_like(params.data)
        self.exp_avg_sq = torch.zeros_like(params.data)
        self.steps = 0
        self._step_tensor = torch.zeros((), dtype=torch.float32, device=params.data.device)
        self._scale_tensor = torch.ones((), dtype=torch.float32, device=params.data.device)
        # looked up once: the buffer's tensors never change (only their values), and each attribute costs a
        # microsecond or two at every step
        self._data, self._grad = params.data, params.grad
        self._fused = _FUSED_ADAM is not None and params.data.device.type in ("cpu", "cuda")

    def step(self, lr: float | None = None, samples: float = 1.0) -> float:
        """Clip the mean gradient (the buffer holds the sum over ``samples``) and step; returns the mean's norm
        before clipping. The buffer holds the clipped mean afterwards."""
        grad = self._grad
        norm = float(torch.linalg.vector_norm(grad)) / samples
        scale = 1.0
        if self.max_grad_norm is not None:
            scale = min(1.0, self.max_grad_norm / (norm + 1e-6))
        self.steps += 1
        lr = self.lr if lr is None else lr
        if self._fused:
            # torch's own fused Adam kernel; it divides the gradient by grad_scale (in place), which is
            # where the mean's divisor and the clip coefficient go. Same arithmetic as the fallback below.
            self._step_tensor.fill_(self.steps)
            self._scale_tensor.fill_(samples / scale)
            _FUSED_ADAM(
                [self._data],
                [grad],
                [self.exp_avg],
                [self.exp_avg_sq],
                [],
                [self._step_tensor],
                lr=lr,
                beta1=self.beta1,
                beta2=self.beta2,
                weight_decay=0.0,
                eps=self.eps,
                amsgrad=False,
                maximize=False,
                grad_scale=self._scale_tensor,
                found_inf=None,
            )
            return norm
        b1, b2 = self.beta1, self.beta2
        grad.mul_(scale / samples)
        self.exp_avg.mul_(b1).add_(grad, alpha=1.0 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
        bias1 = 1.0 - b1**self.steps
        bias2 = 1.0 - b2**self.steps
        denom = self.exp_avg_sq.sqrt().div_(math.sqrt(bias2)).add_(self.eps)
        step_size = lr / bias1
        self._data.addcdiv_(self.exp_avg, denom, value=-step_size)
        return norm

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "exp_avg": self.exp_avg.cpu().clone(),
            "exp_avg_sq": self.exp_avg_sq.cpu().clone(),
            "steps": torch.tensor([self.steps], dtype=torch.int64),
        }

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.exp_avg.copy_(tensors["exp_avg"])
        self.exp_avg_sq.copy_(tensors["exp_avg_sq"])
        self.steps = int(tensors["steps"][0])


class ClippedRMSprop:
    """RMSProp (Tieleman & Hinton 2012) on a :class:`ParamBuffer`, clipped as :class:`ClippedAdam` is.

    The update of ``torch.optim.RMSprop`` without momentum or centring:
    ``s = alpha s + (1 - alpha) g^2``, ``p -= lr g / (sqrt(s) + eps)``. Its state has Adam's names so the
    start-up broadcast and checkpoints carry either: ``exp_avg_sq`` is ``s``, ``exp_avg`` stays zero.
    """

    def __init__(self, params: ParamBuffer, lr: float, alpha: float, eps: float, max_grad_norm: float | None):
        self.params = params
        self.lr, self.alpha, self.eps, self.max_grad_norm = lr, alpha, eps, max_grad_norm
        self.exp_avg = torch.zeros_like(params.data)
        self.exp_avg_sq = torch.zeros_like(params.data)
        self.steps = 0

    def step(self, lr: float | None = None, samples: float = 1.0) -> float:
        """Clip the mean gradient (the buffer holds the sum over ``samples``) and step; returns the mean's norm
        before clipping. The buffer holds the clipped mean afterwards."""
        grad = self.params.grad
        norm = float(torch.linalg.vector_norm(grad)) / samples
        scale = 1.0 if self.max_grad_norm is None else min(1.0, self.max_grad_norm / (norm + 1e-6))
        self.steps += 1
        grad.mul_(scale / samples)
        self.exp_avg_sq.mul_(self.alpha).addcmul_(grad, grad, value=1.0 - self.alpha)
        denom = self.exp_avg_sq.sqrt().add_(self.eps)
        self.params.data.addcdiv_(grad, denom, value=-(self.lr if lr is None else lr))
        return norm

    state_dict = ClippedAdam.state_dict
    load_state_dict = ClippedAdam.load_state_dict


FlatOptimizer = ClippedAdam | ClippedRMSprop
"""The optimizers over one flat buffer: both clip after the sync and keep ``exp_avg``, ``exp_avg_sq`` and ``steps``."""
