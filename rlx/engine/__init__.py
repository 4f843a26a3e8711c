"""The training engine, plain Python without Ray: build the HF model, apply FSDP, checkpointing, activation
offload, tiling, the fused head and Ulysses sequence parallelism; log-probs, values and the update skeleton.
Workers, benchmarks and torchrun tests construct it the same way."""
