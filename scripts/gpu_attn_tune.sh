export PYTHONPATH=.; python3 scripts/gpu_attn_tune.py 2>&1 | tail -8
