"""What is in the data, on token ids: duplicate documents, benchmark contamination by n-gram overlap, and where each
document came from.

Duplicate documents are found by ``TokenReader.duplicates()`` (the hashing lives in :mod:`tokformats.core.duplicates`,
below the readers); :func:`tokformats.quality.contamination.contamination` needs a tokenizer for text eval sets, so it
lives here, above tokenization.
"""
