"""Pure metric functions: arrays or strings in, a number or a small named result out (no files)."""
