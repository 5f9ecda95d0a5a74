"""`precisecoder demo`: a CPU-scale reproduction of PreciseCoder vs GRPO on a micro debugging domain."""
