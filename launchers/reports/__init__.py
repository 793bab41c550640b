"""What a run and a sweep print: run summary, sweep table, seed statistics, quantization bars."""
