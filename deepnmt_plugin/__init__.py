"""deepnmt: deep Transformer recipes (Admin, DeepNorm, T-Fixup, Pre-LN) as a fairseq plugin.

``fairseq-train --user-dir deepnmt_plugin --arch transformer_deepnorm ...``; importing this
package registers the model, its architectures and the optimisation extras with fairseq.
"""

from deepnmt_plugin import compat

compat.install()

from deepnmt_plugin import models, optim, tasks  # noqa: E402,F401  (registers with fairseq)

__version__ = "0.1.0"
