"""Job output: following logs by byte offset, making them terminal-safe, and (analyze) reading meaning out of them."""
