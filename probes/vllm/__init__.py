"""probes/vllm."""
