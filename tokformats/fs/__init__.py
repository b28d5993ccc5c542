"""Local files, durable and untrusted: path expansion, atomic commits and the commit journal, copies the kernel
makes, and reads of files whose sizes and contents are not trusted."""
