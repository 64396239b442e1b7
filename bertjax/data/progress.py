"""The progress line of a corpus preparation (bertjax.data.prepare_lib): read share, ETA, documents, tokens, rows."""

import time

from bertjax.data import sources


def _human(x: float) -> str:
  for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= size:
      return f"{x / size:.1f}{unit}"
  return f"{x:.0f}"


class Progress:
  """A progress line on `stream`: redrawn in place on a terminal, else a new line every `every` seconds."""

  def __init__(self, reader: sources.Reader, stream, every: float = 15.0):
    self.reader, self.stream = reader, stream
    self.start = self.last = time.time()
    self.tty = hasattr(stream, "isatty") and stream.isatty()
    self.every = 0.2 if self.tty else every

  def update(self, stats: sources.SourceStats, tokens: int, rows: int, force: bool = False):
    now = time.time()
    if not force and now - self.last < self.every:
      return
    self.last, elapsed = now, max(now - self.start, 1e-9)
    parts = []
    total = self.reader.total
    if total:
      done = min(stats.progress / total, 1.0)
      bar = "#" * int(done * 24)
      eta = elapsed * (1 - done) / done if done > 0 else 0
      parts.append(f"[{bar:<24}] {done:6.1%} of {_human(total)} {self.reader.unit}, ETA {eta:.0f}s")
    parts.append(f"documents {stats.documents:,}  tokens {_human(tokens)}  rows {rows:,}  "
                 f"{_human(tokens / elapsed)} tokens/s")
    line = "prepare " + "  ".join(parts)
    print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=self.stream, flush=True)

  def close(self):
    if self.tty:
      print(file=self.stream, flush=True)
