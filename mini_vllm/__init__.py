"""mini_vllm: a small, real, vLLM-shaped inference engine built up by the course.

    from mini_vllm import LLM, SamplingParams

The package root stays light: `LLM` (which imports torch) is loaded on first use.
"""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from mini_vllm.llm import LLM

        return LLM
    if name == "SamplingParams":
        from mini_vllm.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'mini_vllm' has no attribute {name!r}")
