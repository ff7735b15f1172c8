"""``distrl export``: a trained policy as one self-contained ONNX or TorchScript file, checked as it is written.

The graph (see :mod:`distrl.export.graph` for its inputs and outputs) is traced from the run's weights, written
beside a temporary name, run with onnxruntime (or TorchScript) on observations drawn from the run's environment,
and compared with the policy acting in distrl on the same observations (and the same noise, for a stochastic
export): identical actions for choices, within :data:`~distrl.export.writer.TOLERANCE` for continuous actions. Only a graph that passes
takes its name, with a JSON file beside it (``FILE.json``) naming the spaces, the inputs and outputs, what the
graph does to observations and actions, the check's figures and the distrl version.

The work is in ``writer`` (tracing, the check, metadata) and ``graph`` (the acting policy as one module); this
package's root names only :class:`ExportFailed`, so that the command line can catch it without loading torch.

Imports: :mod:`distrl.nets`, :mod:`distrl.data` (normalisers), :mod:`distrl.envs`, :mod:`distrl.run`,
:mod:`distrl.config`; the API and the command line import it.
"""

from __future__ import annotations


class ExportFailed(Exception):
    """The policy could not be traced, or the written graph did not act as it does; nothing was kept."""
