"""Running the pipeline's pieces in one process: composition root, threads, event loops, metrics."""
