"""Text into token files: inputs (text, JSONL, Parquet, ...), tokenizers and their vocabularies, encoding engines
proven identical to ``tokenizers``, and the resumable pipeline behind :func:`tokformats.tokenize`."""
