"""The CUDA-graph simulator of Phase 05, under the name the course imports it by.

    from mini_vllm.cudagraph import GraphRunner, PiecewiseGraphRunner, SimDevice

The code lives in mini_vllm/teaching/cudagraph.py, beside the other teaching models.
Importing this name hands back that very module (not a copy), so both import paths
give the same classes.
"""

import sys

from mini_vllm.teaching import cudagraph as _simulator

sys.modules[__name__] = _simulator
