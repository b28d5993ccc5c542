"""What is in the data, on token ids: duplicate documents, benchmark contamination by n-gram overlap, and where each
document came from."""
