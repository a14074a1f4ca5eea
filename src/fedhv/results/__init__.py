"""Run-directory I/O. Never imports torch: results can be read without the training stack."""
