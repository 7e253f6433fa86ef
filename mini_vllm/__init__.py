"""mini_vllm: a small, real, vLLM-shaped inference engine built up by the course.

Import what you need from its modules (mini_vllm.config, mini_vllm.cudagraph, ...).
The package root stays light: importing it loads neither torch nor numpy.
"""

__version__ = "0.1.0"
