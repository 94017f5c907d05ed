"""probes/trtllm."""
